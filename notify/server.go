package notify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/notify/proto"
)

// Defaults for checkpoint requests that leave a value out, and the bounds
// the app holds to whatever the CLI asks.
const (
	DefaultHookBudget  = 10 * time.Second
	DefaultResumeAfter = 30 * time.Second
	DefaultMaxSuspend  = 5 * time.Minute
	DefaultAfterBudget = 30 * time.Second
)

// SocketPrefix and SocketSuffix frame the base name of every control socket;
// kcr recognises the socket among a process's fds by them.
const (
	SocketPrefix = "kcr-"
	SocketSuffix = ".sock"
)

// Option configures a Server.
type Option func(*serverConfig)

type serverConfig struct {
	path        string
	dir         string
	log         *slog.Logger
	maxSuspend  time.Duration
	pollEvery   time.Duration
	restoreWait time.Duration
	afterBudget time.Duration
}

// WithSocketPath binds the control socket at path. Its base name must start
// with "kcr-" and end in ".sock", so that kcr can find it from the PID.
func WithSocketPath(path string) Option { return func(c *serverConfig) { c.path = path } }

// WithSocketDir binds the control socket as kcr-<pid>.sock in dir, which is
// created with mode 0700. The default is $KCR_SOCKET_DIR, else /run/kcr for
// root, else $XDG_RUNTIME_DIR/kcr, else $TMPDIR/kcr-<uid>.
func WithSocketDir(dir string) Option { return func(c *serverConfig) { c.dir = dir } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *serverConfig) { c.log = l } }

// WithMaxSuspend caps how long the app waits for kcr's follow-up after its
// before-checkpoint hooks ran, whatever the CLI asks. Default 5 minutes.
func WithMaxSuspend(d time.Duration) Option { return func(c *serverConfig) { c.maxSuspend = d } }

// WithRestoreGrace sets how long a process that detected by itself that it
// was restored waits for kcr's after-restore message (which carries the
// restore generation) before running its hooks anyway. Default 1 s.
func WithRestoreGrace(d time.Duration) Option { return func(c *serverConfig) { c.restoreWait = d } }

// WithAfterBudget bounds the after-restore phase when kcr does not say.
func WithAfterBudget(d time.Duration) Option { return func(c *serverConfig) { c.afterBudget = d } }

// Server is a registry's control socket: a listening Unix socket, mode 0600,
// that accepts only root and the process's own user.
type Server struct {
	g    *Registry
	cfg  serverConfig
	ln   *net.UnixListener
	path string
	pid  int
	uid  int

	mu        sync.Mutex
	state     string
	followups chan followup // non-nil while waiting for a follow-up
	closed    bool
	quit      chan struct{} // closed by Close
	wg        sync.WaitGroup
}

type followup struct {
	msg   proto.Message
	reply chan proto.Message // receives TypeDone; buffered
}

// Start opens the registry's control socket and serves it until Close.
func (g *Registry) Start(opts ...Option) (*Server, error) {
	cfg := serverConfig{
		log:         slog.Default(),
		maxSuspend:  DefaultMaxSuspend,
		pollEvery:   100 * time.Millisecond,
		restoreWait: time.Second,
		afterBudget: DefaultAfterBudget,
	}
	for _, o := range opts {
		o(&cfg)
	}
	pid := os.Getpid()
	path := cfg.path
	if path == "" {
		dir := cfg.dir
		if dir == "" {
			dir = defaultSocketDir()
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("notify: create socket dir: %w", err)
		}
		path = filepath.Join(dir, SocketPrefix+strconv.Itoa(pid)+SocketSuffix)
	}
	base := filepath.Base(path)
	if len(base) <= len(SocketPrefix)+len(SocketSuffix) || base[:len(SocketPrefix)] != SocketPrefix || filepath.Ext(base) != SocketSuffix {
		return nil, fmt.Errorf("notify: socket name %q must look like kcr-NAME.sock so that kcr can find it", base)
	}
	removeStale(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("notify: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("notify: chmod %s: %w", path, err)
	}
	s := &Server{g: g, cfg: cfg, ln: ln, path: path, pid: pid, uid: os.Getuid(), state: "idle", quit: make(chan struct{})}
	s.wg.Add(1)
	go s.serve()
	cfg.log.Debug("kcr control socket listening", "path", path)
	return s, nil
}

func defaultSocketDir() string {
	if d := os.Getenv("KCR_SOCKET_DIR"); d != "" {
		return d
	}
	if os.Getuid() == 0 {
		return "/run/kcr"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kcr")
	}
	return filepath.Join(os.TempDir(), "kcr-"+strconv.Itoa(os.Getuid()))
}

// removeStale removes a socket file left behind by a dead process, but never
// one that somebody still listens on.
func removeStale(path string) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		return
	}
	c, err := net.DialTimeout("unix", path, 200*time.Millisecond)
	if err == nil {
		c.Close()
		return
	}
	os.Remove(path)
}

// Path returns the control socket's path.
func (s *Server) Path() string { return s.path }

// Close stops serving and removes the socket. A checkpoint cycle that is
// waiting for its follow-up resumes first.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.quit)
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	sem := make(chan struct{}, 8) // bound concurrent control connections
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.cfg.log.Warn("kcr control socket accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			s.handle(c)
		}()
	}
}

// peerAllowed accepts root and the socket owner's uid.
func (s *Server) peerAllowed(c *net.UnixConn) (*unix.Ucred, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return nil, false
	}
	return cred, cred.Uid == 0 || int(cred.Uid) == s.uid
}

func (s *Server) handle(c *net.UnixConn) {
	closeConn := true
	defer func() {
		if closeConn {
			c.Close()
		}
	}()
	cred, ok := s.peerAllowed(c)
	if !ok {
		attrs := []any{"path", s.path}
		if cred != nil {
			attrs = append(attrs, "peer_uid", cred.Uid, "peer_pid", cred.Pid)
		}
		s.cfg.log.Warn("kcr control socket: refused peer with another uid", attrs...)
		c.SetWriteDeadline(time.Now().Add(time.Second))
		proto.Write(c, proto.Message{Type: proto.TypeError, Error: "permission denied: only root or the process owner may control it"})
		return
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, err := proto.Read(c)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.cfg.log.Warn("kcr control socket: bad request", "err", err)
			c.SetWriteDeadline(time.Now().Add(time.Second))
			proto.Write(c, proto.Message{Type: proto.TypeError, Error: err.Error()})
		}
		return
	}
	c.SetReadDeadline(time.Time{})
	switch m.Type {
	case proto.TypeHello:
		s.reply(c, s.info())
	case proto.TypeCheckpoint:
		// checkpoint closes c itself, before it answers "ready".
		closeConn = false
		s.checkpoint(c, m)
	case proto.TypeResume, proto.TypeRestored:
		s.mu.Lock()
		ch := s.followups
		s.mu.Unlock()
		if ch == nil {
			s.reply(c, proto.Message{Type: proto.TypeError, Error: "no checkpoint is waiting for a " + m.Type + " message"})
			return
		}
		f := followup{msg: m, reply: make(chan proto.Message, 1)}
		select {
		case ch <- f:
		default:
			s.reply(c, proto.Message{Type: proto.TypeError, Error: "a follow-up is already being handled"})
			return
		}
		// The CLI bounds its own wait; we answer whenever hooks finish.
		s.reply(c, <-f.reply)
	default:
		s.reply(c, proto.Message{Type: proto.TypeError, Error: "unexpected message type " + m.Type})
	}
}

func (s *Server) reply(c *net.UnixConn, m proto.Message) {
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := proto.Write(c, m); err != nil {
		s.cfg.log.Debug("kcr control socket: reply", "type", m.Type, "err", err)
	}
}

func (s *Server) info() proto.Message {
	st, _ := startTime(s.pid)
	gen, id := s.g.Identity()
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	return proto.Message{Type: proto.TypeInfo, PID: os.Getpid(), StartTime: st, Resources: s.g.Names(),
		State: state, InstanceID: id, AppGeneration: gen}
}

func (s *Server) setState(st string) {
	s.mu.Lock()
	s.state = st
	s.mu.Unlock()
}

// checkpoint runs one cycle: before hooks, "ready", then the wait for the
// CLI's follow-up, and the after hooks. It returns when the cycle is over.
func (s *Server) checkpoint(c *net.UnixConn, m proto.Message) {
	cyc, err := s.g.begin()
	if err != nil {
		s.reply(c, proto.Message{Type: proto.TypeBusy, Error: ErrBusy.Error()})
		c.Close()
		return
	}
	log := s.cfg.log
	budget := m.HookBudget
	if budget <= 0 {
		budget = DefaultHookBudget
	}
	resumeAfter := m.ResumeAfter
	if resumeAfter <= 0 {
		resumeAfter = DefaultResumeAfter
	}
	if resumeAfter > s.cfg.maxSuspend {
		resumeAfter = s.cfg.maxSuspend
	}
	st0, _ := startTime(s.pid)
	s.setState("checkpointing")

	ctx, cancel := context.WithTimeout(context.Background(), budget)
	reports, berr := cyc.before(ctx)
	cancel()

	if berr != nil {
		log.Warn("kcr: before-checkpoint hooks failed; resuming", "err", berr)
		s.setState("resuming")
		actx, cancel := context.WithTimeout(context.Background(), s.cfg.afterBudget)
		_, after, aerr := cyc.after(actx, Event{Kind: Resume, Reason: "checkpoint failed: " + berr.Error()})
		cancel()
		if aerr != nil {
			log.Warn("kcr: after-restore hooks failed on resume", "err", aerr)
		}
		cyc.end()
		s.setState("idle")
		msg := proto.Message{Type: proto.TypeFailed, Reports: append(reports, after...), Error: berr.Error()}
		s.reply(c, msg)
		c.Close()
		return
	}

	// Ready: open the follow-up channel first, then answer and close the
	// connection, so CRIU sees no half of a Unix connection to the CLI.
	ch := make(chan followup, 1)
	s.mu.Lock()
	s.followups = ch
	s.state = "waiting"
	s.mu.Unlock()
	s.reply(c, proto.Message{Type: proto.TypeReady, PID: s.pid, StartTime: st0, Reports: reports})
	c.Close()

	ev, f := s.await(ch, st0, resumeAfter)

	s.mu.Lock()
	s.followups = nil
	s.state = "restoring"
	s.mu.Unlock()
	abudget := s.cfg.afterBudget
	if f != nil && f.msg.Wait > 0 {
		abudget = max(abudget, f.msg.Wait)
	}
	actx, cancel := context.WithTimeout(context.Background(), abudget)
	ev, after, aerr := cyc.after(actx, ev)
	cancel()
	late := cyc.end()
	s.setState("idle")
	lvl := slog.LevelInfo
	if aerr != nil {
		lvl = slog.LevelWarn
	}
	log.Log(context.Background(), lvl, "kcr: after-restore hooks done", "kind", ev.Kind.String(), "reason", ev.Reason,
		"generation", ev.Generation, "instance_id", ev.InstanceID, "self_detected", ev.SelfDetected, "err", aerr)
	if len(late) > 0 {
		log.Warn("kcr: resources registered during the checkpoint join from the next one", "resources", late)
	}
	if f != nil {
		done := proto.Message{Type: proto.TypeDone, PID: os.Getpid(), Reports: after, InstanceID: ev.InstanceID,
			AppGeneration: ev.Generation, State: ev.Kind.String()}
		if aerr != nil {
			done.Error = aerr.Error()
		}
		f.reply <- done
	}
}

// await waits for the CLI's follow-up, the deadline, or the sign that the
// process was restored (its start time changed), and says what happened.
func (s *Server) await(ch chan followup, st0 uint64, resumeAfter time.Duration) (Event, *followup) {
	deadline := time.NewTimer(resumeAfter)
	defer deadline.Stop()
	poll := time.NewTicker(s.cfg.pollEvery)
	defer poll.Stop()
	restored := func() bool {
		st, err := startTime(s.pid)
		return err == nil && st != st0
	}
	for {
		select {
		case f := <-ch:
			return s.eventFor(f, restored()), &f
		case <-poll.C:
			if !restored() {
				continue
			}
			// Restored, but kcr's message has not come yet: give it a moment,
			// it carries the restore generation.
			grace := time.NewTimer(s.cfg.restoreWait)
			select {
			case f := <-ch:
				grace.Stop()
				return s.eventFor(f, true), &f
			case <-grace.C:
				return Event{Kind: Restore, Reason: "restored (kcr's after-restore message did not arrive)", SelfDetected: true}, nil
			}
		case <-s.quit:
			return Event{Kind: Resume, Reason: "control socket closed during checkpoint"}, nil
		case <-deadline.C:
			if restored() {
				return Event{Kind: Restore, Reason: "restored (kcr's after-restore message did not arrive)", SelfDetected: true}, nil
			}
			s.cfg.log.Warn("kcr: no follow-up from kcr after checkpoint; resuming on our own", "after", resumeAfter)
			return Event{Kind: Resume, Reason: fmt.Sprintf("no follow-up from kcr within %v", resumeAfter)}, nil
		}
	}
}

func (s *Server) eventFor(f followup, restored bool) Event {
	m := f.msg
	if m.Type == proto.TypeRestored || restored {
		// The start time is the ground truth: a "resume" sent to a restored
		// copy still makes it a new instance.
		return Event{Kind: Restore, Generation: m.Generation, Reason: "restored"}
	}
	reason := m.Reason
	if reason == "" {
		reason = "resumed"
	}
	return Event{Kind: Resume, Reason: reason}
}
