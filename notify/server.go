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
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/notify/proto"
)

// errKCRGone cancels the before-checkpoint hooks when kcr hangs up.
var errKCRGone = errors.New("kcr went away during the before-checkpoint hooks")

// Defaults for checkpoint requests that leave a value out, and the bounds
// the app holds to whatever the CLI asks: the contract's, see package proto.
const (
	DefaultHookBudget    = proto.DefaultHookBudget
	DefaultResumeAfter   = proto.DefaultResumeAfter
	DefaultMaxSuspend    = proto.DefaultMaxSuspend
	DefaultAfterBudget   = proto.DefaultAfterBudget
	DefaultMaxHookBudget = proto.DefaultMaxHookBudget
)

// SocketPrefix and SocketSuffix frame the base name of every control socket
// (proto.SocketName).
const (
	SocketPrefix = proto.SocketPrefix
	SocketSuffix = proto.SocketSuffix
)

// Option configures a Server.
type Option func(*serverConfig)

type serverConfig struct {
	path        string
	dir         string
	log         *slog.Logger
	maxSuspend  time.Duration
	maxBudget   time.Duration
	pollEvery   time.Duration
	restoreWait time.Duration
	afterBudget time.Duration
	// startTime reads a task's start time; a field so that tests can fake a
	// restore, which needs CRIU otherwise.
	startTime func(pid int) (uint64, error)
	// hostPID reads the process's host PID; a field so that tests can fake
	// the new PID of a restored copy.
	hostPID func() int
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

// WithMaxHookBudget caps the budget of the before-checkpoint hooks, whatever
// the CLI asks; a larger request is clamped to it and logged. Default 2
// minutes.
func WithMaxHookBudget(d time.Duration) Option { return func(c *serverConfig) { c.maxBudget = d } }

// WithRestoreGrace sets how long a process that detected by itself that it
// was restored waits for kcr's after-restore message (which carries the
// restore generation) before running its hooks anyway. Default 2 s.
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
	// knownStart is the start time of the instance the hooks last saw;
	// watch runs a restore when it changes outside a cycle.
	knownStart uint64
	quit       chan struct{} // closed by Close
	wg         sync.WaitGroup
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
		maxBudget:   DefaultMaxHookBudget,
		pollEvery:   25 * time.Millisecond,
		restoreWait: 2 * time.Second,
		afterBudget: DefaultAfterBudget,
		startTime:   startTime,
		hostPID:     hostPID,
	}
	for _, o := range opts {
		o(&cfg)
	}
	pid := cfg.hostPID()
	path := cfg.path
	if path == "" {
		dir := cfg.dir
		if dir == "" {
			dir = defaultSocketDir()
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("notify: create socket dir: %w", err)
		}
		path = filepath.Join(dir, proto.SocketName(pid))
	}
	path, err := safeSocketPath(path)
	if err != nil {
		return nil, err
	}
	if !proto.IsSocketName(path) {
		return nil, fmt.Errorf("notify: socket name %q must look like kcr-NAME.sock so that kcr can find it", filepath.Base(path))
	}
	ln, err := listen(path)
	if err != nil {
		return nil, err
	}
	st, _ := cfg.startTime(pid)
	s := &Server{g: g, cfg: cfg, ln: ln, path: path, pid: pid, uid: os.Geteuid(), state: "idle", knownStart: st, quit: make(chan struct{})}
	s.wg.Add(2)
	go s.serve(ln)
	go s.watch()
	cfg.log.Debug("kcr control socket listening", "path", path)
	return s, nil
}

// safeSocketPath checks that nobody but this process's user can change
// what is bound at path: its directory is a real directory (not a symlink)
// owned by the effective uid that neither group nor others may write to
// (reading it lets nobody replace the socket, which is 0600 anyway).
// Symlinks above it are resolved, because kcr follows none when it
// connects.
func safeSocketPath(path string) (string, error) {
	if i := strings.IndexFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return "", fmt.Errorf("notify: socket path %q holds a control character: choose another WithSocketPath or KCR_SOCKET_DIR", path)
	}
	dir, base := filepath.Split(filepath.Clean(path))
	dir = filepath.Clean(dir)
	parent, err := filepath.EvalSymlinks(filepath.Dir(dir))
	if err != nil {
		return "", fmt.Errorf("notify: socket dir %s: %w", dir, err)
	}
	if dir != "/" {
		dir = filepath.Join(parent, filepath.Base(dir))
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("notify: socket dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("notify: socket dir %s: no owner information", dir)
	}
	switch {
	case !fi.IsDir():
		return "", fmt.Errorf("notify: socket dir %s is a %v, not a directory: remove it, or choose another KCR_SOCKET_DIR", dir, fi.Mode().Type())
	case int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("notify: socket dir %s belongs to uid %d, not to this process's uid %d, so its owner could replace the control socket: remove it, or choose another KCR_SOCKET_DIR", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("notify: socket dir %s has mode %04o, so others could replace the control socket: chmod 700 %s", dir, fi.Mode().Perm(), dir)
	}
	return filepath.Join(dir, base), nil
}

// listen binds a control socket at path, mode 0600.
func listen(path string) (*net.UnixListener, error) {
	if live := removeStale(path); live {
		return nil, fmt.Errorf("notify: listen on %s: another process is serving a control socket there (pass another WithSocketPath or WithSocketDir): %w", path, syscall.EADDRINUSE)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("notify: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("notify: chmod %s: %w", path, err)
	}
	return ln, nil
}

// rebind moves the control socket to a path named after the process's new
// host PID. Clones restored from one image in PID namespaces of their own
// share the image's socket path; each moves to its own so that kcr reaches
// every clone through its PID. The old path is left alone: it may be a
// sibling's by now.
func (s *Server) rebind(pid int) {
	s.mu.Lock()
	old, oldPath := s.ln, s.path
	closed := s.closed
	s.mu.Unlock()
	if closed || pid == s.pid {
		return
	}
	base := strings.TrimSuffix(filepath.Base(oldPath), SocketSuffix)
	if prev := SocketPrefix + strconv.Itoa(s.pid); base == prev {
		base = SocketPrefix + strconv.Itoa(pid)
	} else {
		base += "-" + strconv.Itoa(pid)
	}
	path := filepath.Join(filepath.Dir(oldPath), base+SocketSuffix)
	ln, err := listen(path)
	if err != nil {
		s.cfg.log.Warn("kcr: cannot move the control socket after restore; keeping the old one", "path", path, "err", err)
		return
	}
	s.mu.Lock()
	if s.closed {
		// Close ran while we bound: it closed the old listener only, and
		// waits for this goroutine, so serving ln would never end.
		s.mu.Unlock()
		ln.Close()
		return
	}
	s.ln, s.path, s.pid = ln, path, pid
	s.wg.Add(1) // under s.mu, so that Close's Wait counts it
	s.mu.Unlock()
	old.SetUnlinkOnClose(false)
	old.Close()
	go s.serve(ln)
	s.cfg.log.Debug("kcr control socket moved after restore", "path", path)
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
// one that somebody still listens on; it reports whether one does. Only
// ECONNREFUSED proves that nobody listens: a full backlog (EAGAIN), a timeout
// or EACCES do not, and the file is then left alone for bind to fail on.
func removeStale(path string) (live bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		return false
	}
	c, err := net.DialTimeout("unix", path, 200*time.Millisecond)
	if err == nil {
		c.Close()
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(path)
	}
	return false
}

// Path returns the control socket's path.
func (s *Server) Path() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.path
}

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
	ln := s.ln
	s.mu.Unlock()
	err := ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) serve(ln *net.UnixListener) {
	defer s.wg.Done()
	sem := make(chan struct{}, 8) // bound concurrent control connections
	for {
		c, err := ln.AcceptUnix()
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
		attrs := []any{"path", s.Path()}
		if cred != nil {
			attrs = append(attrs, "peer_uid", cred.Uid, "peer_pid", cred.Pid)
		}
		s.cfg.log.Warn("kcr control socket: refused peer with another uid", attrs...)
		// Take the request first: answering and closing before it came in
		// would make the peer's write fail (EPIPE) and hide the answer.
		c.SetReadDeadline(time.Now().Add(time.Second))
		proto.Read(c)
		c.SetWriteDeadline(time.Now().Add(time.Second))
		proto.Write(c, proto.Message{Type: proto.TypeError, Error: "permission denied: only root or the process owner may control it"})
		return
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Close must not wait for a client that connected and sends nothing.
	stopRead := make(chan struct{})
	go func() {
		select {
		case <-s.quit:
			c.SetReadDeadline(time.Now())
		case <-stopRead:
		}
	}()
	m, err := proto.Read(c)
	close(stopRead)
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
		s.checkpoint(c, m, newPeer(cred, m))
	case proto.TypeResume, proto.TypeRestored:
		f := followup{msg: m, reply: make(chan proto.Message, 1)}
		// Hand f over under s.mu: checkpoint clears s.followups and drains
		// the channel under s.mu too, so f is either taken by await or
		// answered by the drain, never left without an answer.
		s.mu.Lock()
		ch := s.followups
		queued := false
		if ch != nil {
			select {
			case ch <- f:
				queued = true
			default:
			}
		}
		s.mu.Unlock()
		if ch == nil && m.Type == proto.TypeRestored {
			if done, ok := s.restoredMessage(m); ok {
				s.reply(c, done)
				return
			}
		}
		if ch == nil {
			s.reply(c, proto.Message{Type: proto.TypeError, Error: "no checkpoint is waiting for a " + m.Type + " message"})
			return
		}
		if !queued {
			s.reply(c, proto.Message{Type: proto.TypeError, Error: "a follow-up is already being handled"})
			return
		}
		// The CLI bounds its own wait; we answer whenever hooks finish.
		s.reply(c, <-f.reply)
	default:
		s.reply(c, proto.Message{Type: proto.TypeError, Error: "unexpected message type " + m.Type})
	}
}

func (s *Server) reply(c *net.UnixConn, m proto.Message) error {
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	err := proto.Write(c, m)
	if errors.Is(err, proto.ErrTooLarge) {
		// Huge hook errors or details must not cost the CLI its answer.
		s.cfg.log.Warn("kcr control socket: reply too large; dropping report details", "type", m.Type)
		err = proto.Write(c, proto.Fit(m))
	}
	if err != nil {
		s.cfg.log.Debug("kcr control socket: reply", "type", m.Type, "err", err)
	}
	return err
}

func (s *Server) info() proto.Message {
	st, _ := s.cfg.startTime(s.hostPID())
	gen, id := s.g.Identity()
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	return proto.Message{Type: proto.TypeInfo, PID: s.hostPID(), StartTime: st, Resources: s.g.Names(),
		State: state, InstanceID: id, AppGeneration: gen}
}

func (s *Server) hostPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

func (s *Server) setState(st string) {
	s.mu.Lock()
	s.state = st
	s.mu.Unlock()
}

// checkpoint runs one cycle: before hooks, "ready", then the wait for the
// CLI's follow-up, and the after hooks. It returns when the cycle is over.
//
// kcr is watched throughout: while the hooks run through the connection
// (its hangup cancels the hooks), afterwards through its PID, so that the app
// resumes at once when kcr dies instead of waiting for resumeAfter.
func (s *Server) checkpoint(c *net.UnixConn, m proto.Message, kcr peer) {
	asked := time.Now()
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
	if budget > s.cfg.maxBudget {
		log.Warn("kcr: hook budget asked for is above the app's cap; clamped", "asked", budget, "cap", s.cfg.maxBudget)
		budget = s.cfg.maxBudget
	}
	resumeAfter := m.ResumeAfter
	if resumeAfter <= 0 {
		resumeAfter = DefaultResumeAfter
	}
	if resumeAfter > s.cfg.maxSuspend {
		resumeAfter = s.cfg.maxSuspend
	}
	st0, _ := s.cfg.startTime(s.pid)
	s.setState("checkpointing")

	ctx, cancel := context.WithTimeout(withLeaveRunning(context.Background(), m.Leave), budget)
	ctx, cancelCause := context.WithCancelCause(ctx)
	if m.RequireDrained {
		ctx = WithRequireDrained(ctx)
	}
	hup, stopWatch := hangup(c)
	hooksDone := make(chan struct{})
	go func() {
		select {
		case <-hup:
			log.Warn("kcr went away while the before-checkpoint hooks ran; cancelling them")
			cancelCause(errKCRGone)
		case <-hooksDone:
		}
	}()
	reports, berr := cyc.before(ctx)
	close(hooksDone)
	stopWatch()
	cancelCause(nil)
	cancel()

	if berr != nil {
		log.Warn("kcr: before-checkpoint hooks failed; resuming", "err", berr)
		s.setState("resuming")
		resumed := make(chan []Report, 1)
		go func() {
			actx, cancel := context.WithTimeout(context.Background(), s.cfg.afterBudget)
			_, after, aerr := cyc.after(actx, Event{Kind: Resume, Reason: "checkpoint failed: " + berr.Error()})
			cancel()
			if aerr != nil {
				log.Warn("kcr: after-restore hooks failed on resume", "err", aerr)
			}
			cyc.end()
			s.setState("idle")
			resumed <- after
		}()
		// kcr gives up on its answer budget+5s after asking. A resume
		// that takes longer (a Writer resending to a slow broker, the
		// usual cause of a failed checkpoint) must not cost kcr the
		// answer: it goes on after it.
		msg := proto.Message{Type: proto.TypeFailed, Reports: reports, Error: berr.Error()}
		answerBy := time.NewTimer(time.Until(asked.Add(requestBudget(m) + 4*time.Second)))
		defer answerBy.Stop()
		var after []Report
		got := false
		select {
		case after = <-resumed:
			got = true
			msg.Reports = append(msg.Reports, after...)
		case <-answerBy.C:
			log.Warn("kcr: the resume after a failed checkpoint is still running; answering kcr now")
		}
		s.reply(c, msg)
		c.Close()
		if !got {
			<-resumed
		}
		return
	}
	select {
	case <-s.quit:
		// Closed while the hooks ran: await would resume at once, so the
		// CLI must not be told to dump.
		s.setState("resuming")
		actx, cancel := context.WithTimeout(context.Background(), s.cfg.afterBudget)
		cyc.after(actx, Event{Kind: Resume, Reason: "control socket closed during checkpoint"})
		cancel()
		cyc.end()
		s.setState("idle")
		s.reply(c, proto.Message{Type: proto.TypeError, Error: "the control socket was closed during the before-checkpoint hooks; the app resumed"})
		c.Close()
		return
	default:
	}

	// Ready: open the follow-up channel first, then answer and close the
	// connection, so CRIU sees no half of a Unix connection to the CLI.
	ch := make(chan followup, 1)
	s.mu.Lock()
	s.followups = ch
	s.state = "waiting"
	s.mu.Unlock()
	werr := s.reply(c, proto.Message{Type: proto.TypeReady, PID: s.hostPID(), StartTime: st0, Reports: reports})
	c.Close()

	var ev Event
	var f *followup
	if werr != nil {
		// The CLI is gone (it gave up waiting for the hooks, or died): nobody
		// will dump this process, so do not stay suspended for resumeAfter.
		log.Warn("kcr: could not send ready; resuming", "err", werr)
		ev = Event{Kind: Resume, Reason: "kcr went away before the checkpoint: " + werr.Error()}
	} else {
		ev, f = s.await(ch, st0, resumeAfter, kcr)
	}

	s.mu.Lock()
	s.followups = nil
	// A follow-up that came in after await stopped listening gets an answer.
	for drained := false; !drained; {
		select {
		case g := <-ch:
			g.reply <- proto.Message{Type: proto.TypeError, Error: "the checkpoint is no longer waiting for a follow-up: " + ev.Reason}
		default:
			drained = true
		}
	}
	s.state = "restoring"
	s.mu.Unlock()
	abudget := s.cfg.afterBudget
	if f != nil && f.msg.Wait > 0 {
		abudget = max(abudget, f.msg.Wait)
	}
	actx, cancel := context.WithTimeout(context.Background(), abudget)
	ev, after, aerr := cyc.after(actx, ev)
	cancel()
	if ev.Kind == Restore {
		// Before end, so that watch does not take this restore for another.
		st, _ := s.cfg.startTime(s.pid)
		s.mu.Lock()
		s.knownStart = st
		s.mu.Unlock()
	}
	late := cyc.end()
	s.setState("idle")
	s.logAfter(ev, aerr)
	if len(late) > 0 {
		log.Warn("kcr: resources registered during the checkpoint join from the next one", "resources", late)
	}
	if f != nil {
		f.reply <- s.done(ev, after, aerr)
	}
}

// requestBudget is the hook budget kcr waits for, from the request: kcr
// waits that plus 5 s for the answer to a checkpoint.
func requestBudget(m proto.Message) time.Duration {
	if m.HookBudget <= 0 {
		return DefaultHookBudget
	}
	return m.HookBudget
}

// logAfter logs the end of the after-restore hooks.
func (s *Server) logAfter(ev Event, aerr error) {
	lvl := slog.LevelInfo
	if aerr != nil {
		lvl = slog.LevelWarn
	}
	s.cfg.log.Log(context.Background(), lvl, "kcr: after-restore hooks done", "kind", ev.Kind.String(), "reason", ev.Reason,
		"generation", ev.Generation, "instance_id", ev.InstanceID, "self_detected", ev.SelfDetected, "err", aerr)
}

// done is the answer to a follow-up once the after-restore hooks ran.
func (s *Server) done(ev Event, after []Report, aerr error) proto.Message {
	m := proto.Message{Type: proto.TypeDone, PID: s.hostPID(), Reports: after, InstanceID: ev.InstanceID,
		AppGeneration: ev.Generation, State: ev.Kind.String(), Kind: ev.Kind.String()}
	if aerr != nil {
		m.Error = aerr.Error()
	}
	return m
}

// await waits for the CLI's follow-up, the deadline, kcr's death, or the
// sign that the process was restored (its start time changed), and says what
// happened. A restore is checked first: a restored copy outlives the kcr
// that dumped it, and is a new instance all the same.
func (s *Server) await(ch chan followup, st0 uint64, resumeAfter time.Duration, kcr peer) (Event, *followup) {
	deadline := time.NewTimer(resumeAfter)
	defer deadline.Stop()
	poll := time.NewTicker(s.cfg.pollEvery)
	defer poll.Stop()
	restored := func() bool {
		st, err := s.cfg.startTime(s.pid)
		return err == nil && st != st0
	}
	// graceWait runs once the process knows it was restored but kcr's
	// message has not come yet: give it a moment, it carries the restore
	// generation.
	graceWait := func() (Event, *followup) {
		grace := time.NewTimer(s.cfg.restoreWait)
		defer grace.Stop()
		selfDetected := Event{Kind: Restore, Reason: "restored (kcr's after-restore message did not arrive)", SelfDetected: true}
		select {
		case f := <-ch:
			return s.eventFor(f, true), &f
		case <-grace.C:
			return selfDetected, nil
		case <-s.quit:
			return selfDetected, nil
		}
	}
	for {
		select {
		case f := <-ch:
			r := restored()
			if r {
				s.rebind(s.cfg.hostPID())
			}
			return s.eventFor(f, r), &f
		case <-poll.C:
			if restored() {
				s.rebind(s.cfg.hostPID())
				return graceWait()
			}
			if kcr.gone() {
				s.cfg.log.Warn("kcr exited before its follow-up; resuming", "kcr_pid", kcr.pid)
				return Event{Kind: Resume, Reason: fmt.Sprintf("kcr (PID %d) exited before its follow-up", kcr.pid)}, nil
			}
		case <-s.quit:
			if restored() {
				return graceWait()
			}
			return Event{Kind: Resume, Reason: "control socket closed during checkpoint"}, nil
		case <-deadline.C:
			// After a restore the monotonic clock may be far ahead of the
			// dumped process's, so this timer fires at once: the restore must
			// still wait for kcr's message.
			if restored() {
				s.rebind(s.cfg.hostPID())
				return graceWait()
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
		return Event{Kind: Restore, Generation: m.Generation, Name: m.Name, Reason: "restored"}
	}
	reason := m.Reason
	if reason == "" {
		reason = "resumed"
	}
	return Event{Kind: Resume, Reason: reason}
}
