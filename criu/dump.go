package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

// logLevel is CRIU's debug level, for the lazy-pages daemon, whose log kcr
// reads for its statistics.
const logLevel = 4

// dumpLogLevel is CRIU's default level (errors and warnings) for dumps and
// restores: the debug level writes a thousand lines for a small process and
// slows a dump by about a quarter, while the process is frozen.
// DumpOptions.LogLevel and RestoreOptions.LogLevel (kcr -v) raise it.
const dumpLogLevel = 2

// level returns l, or the dump default for 0.
func level(l int) int32 {
	if l <= 0 {
		return dumpLogLevel
	}
	return int32(l)
}

// DumpOptions configures Dump.
type DumpOptions struct {
	PID       int    // root of the process tree to dump
	ImagesDir string // existing directory for the images (and the log and stats-dump)
	LogFile   string // log file name inside ImagesDir; default "dump.log"
	LogLevel  int    // CRIU's log level, 1 (errors) to 4 (debug); default 2

	// LeaveRunning keeps the tree running after the dump. Otherwise CRIU
	// kills it; use WaitGone before restoring it on this machine.
	LeaveRunning bool
	// ShellJob allows a tree attached to a terminal or not leading its own
	// session (see ShellJobNeeded). Such trees restore badly.
	ShellJob bool
	// FileLocks dumps file locks (flock, POSIX locks) held by the tree.
	FileLocks bool
	// TCPClose dumps open TCP connections as closed; the restored process
	// sees them fail. Restore must be given TCPClose as well.
	TCPClose bool
	// TCPEstablished dumps open TCP connections for repair on restore (same
	// machine/addresses only, peer must cooperate). Restore needs it too.
	TCPEstablished bool

	// Notify, if set, is called at each CRIU stage (see NotifyFunc).
	Notify NotifyFunc
}

// DumpResult describes a successful dump.
type DumpResult struct {
	Duration time.Duration // wall time, starting criu included
	LogPath  string
	// Stats is CRIU's stats-dump; nil (with StatsErr set) if unreadable.
	Stats    *DumpStats
	StatsErr error
	// Ready is when CRIU had prepared (started, probed the kernel) and
	// reached its pre-dump stage; set for a dump run with Begin and Go.
	Ready time.Time

	exited chan struct{} // closed when CRIU has exited; nil if it had already
}

// Wait blocks until the CRIU that made the dump has exited (Session.Dump
// returns as soon as CRIU answered). It is safe to call more than once.
func (r *DumpResult) Wait() {
	if r.exited != nil {
		<-r.exited
	}
}

// Dump checkpoints the process tree rooted at opts.PID into opts.ImagesDir
// with "criu swrk". On failure the error is an *Error carrying the first
// real error of the log and a hint.
//
// Cancelling ctx hangs up on CRIU: it aborts at its next notification
// (post-dump at the latest), cures and resumes the tree, and Dump returns
// once it has exited.
func Dump(ctx context.Context, criuPath string, opts DumpOptions) (*DumpResult, error) {
	start := time.Now()
	s, err := StartSession(ctx, criuPath, opts.ShellJob)
	if err != nil {
		return nil, err
	}
	res, err := s.Dump(ctx, opts)
	if res != nil {
		res.Wait()
		res.Duration = time.Since(start)
	}
	return res, err
}

// Session is a started "criu swrk" that waits for one dump. Starting CRIU
// takes several milliseconds (more through a wrapper and a private loader);
// a session started before the target's hooks run keeps that out of the
// time the target is suspended. The session asks the same CRIU for its
// version first (a VERSION request with keep_open, which CRIU serves before
// the dump), so no separate "criu --version" runs.
type Session struct {
	s     *swrk
	begun bool // the dump request was sent: the PendingDump owns s
	path  string
	ctx   context.Context
	ps    *pageServer // SessionOptions.Abandonable
}

// StartSession starts CRIU for one dump. shellJob must match the dump's
// DumpOptions.ShellJob (a shell job's CRIU stays in kcr's process group).
// Cancelling ctx hangs up on CRIU (see Dump). Close a session that is not
// used for a dump.
func StartSession(ctx context.Context, criuPath string, shellJob bool) (*Session, error) {
	return StartDumpSession(ctx, criuPath, SessionOptions{ShellJob: shellJob})
}

// StartDumpSession is StartSession with options.
func StartDumpSession(ctx context.Context, criuPath string, o SessionOptions) (*Session, error) {
	var ps *pageServer
	var extra []*os.File
	if o.Abandonable {
		var err error
		if ps, err = newPageServer(); err != nil {
			return nil, err
		}
		extra = append(extra, ps.dumpEnd)
	}
	s, err := startSwrk(ctx, criuPath, !o.ShellJob, true, extra...)
	if err != nil {
		if ps != nil {
			_ = ps.finish(true)
		}
		return nil, err
	}
	s.askVersion()
	return &Session{s: s, path: criuPath, ctx: ctx, ps: ps}, nil
}

// Path is the CRIU binary the session runs.
func (ss *Session) Path() string { return ss.path }

// Version returns the version of the session's CRIU, from its answer to
// the VERSION request sent at start. It waits for CRIU to have started.
// It may be called before or after Begin, but not during Go.
func (ss *Session) Version() (Version, error) {
	return ss.s.readVersion()
}

// Close stops a session that was not used for a dump. It is safe after Dump.
func (ss *Session) Close() {
	if !ss.begun {
		ss.s.close()
		ss.begun = true
		if ss.ps != nil {
			_ = ss.ps.finish(true)
		}
	}
}

// Dump runs the session's dump; the session is closed afterwards. On
// success it returns as soon as CRIU answered; DumpResult.Wait waits for
// CRIU to exit.
// DumpResult.Duration covers the dump request only.
func (ss *Session) Dump(ctx context.Context, opts DumpOptions) (*DumpResult, error) {
	p, err := ss.begin(opts, false)
	if err != nil {
		return nil, err
	}
	return p.run(ctx, opts.Notify)
}

// Begin sends the session's dump request and returns without waiting. CRIU
// first prepares by itself: it probes the kernel (tens of milliseconds
// where no kerndat cache is kept, that is where /run is not a tmpfs), then
// stops at its pre-dump stage, before it touches the tree, until Go. The
// caller prepares meanwhile. Cancel kills CRIU and a cancelled ctx hangs
// up on it, before it ever seized the tree either way. opts.ImagesDir must
// stay as it is until Go or Cancel.
func (ss *Session) Begin(opts DumpOptions) (*PendingDump, error) {
	return ss.begin(opts, true)
}

// PendingDump is a dump request that CRIU holds at its pre-dump stage.
type PendingDump struct {
	s       *swrk
	dir     *os.File // the images directory CRIU opens through our fd table
	opts    DumpOptions
	logPath string
	start   time.Time
	req     *rpc.CriuReq // not yet sent (Session.Dump)
	sendErr error
	ready   time.Time       // when CRIU reached its pre-dump stage
	held    *rpc.CriuNotify // that notification, answered by Go
	final   *rpc.CriuResp   // CRIU's answer, if it came before the stage
	ps      *pageServer     // SessionOptions.Abandonable
}

func (ss *Session) begin(opts DumpOptions, gated bool) (*PendingDump, error) {
	if ss.begun {
		return nil, errors.New("criu dump: session already used")
	}
	if opts.PID <= 0 {
		ss.Close()
		return nil, fmt.Errorf("criu dump: invalid PID %d", opts.PID)
	}
	if opts.ImagesDir == "" {
		ss.Close()
		return nil, errors.New("criu dump: no images directory")
	}
	logFile := opts.LogFile
	if logFile == "" {
		logFile = "dump.log"
	}
	if filepath.Base(logFile) != logFile {
		ss.Close()
		return nil, fmt.Errorf("criu dump: log file %q must be a plain name (it goes into the images directory)", logFile)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(opts.PID)); errors.Is(err, os.ErrNotExist) {
		ss.Close()
		return nil, &Error{Op: "dump", First: fmt.Sprintf("no process with PID %d", opts.PID), Cause: CauseNoProcess, Hint: CauseNoProcess.Hint()}
	}
	dir, err := os.Open(opts.ImagesDir)
	if err != nil {
		ss.Close()
		return nil, fmt.Errorf("criu dump: images directory: %w", err)
	}
	p := &PendingDump{s: ss.s, dir: dir, opts: opts, logPath: filepath.Join(opts.ImagesDir, logFile), start: time.Now(), ps: ss.ps}
	ss.begun = true
	req := &rpc.CriuReq{
		Type: rpc.CriuReqType_DUMP.Enum(),
		Opts: &rpc.CriuOpts{
			ImagesDirFd:    proto.Int32(int32(dir.Fd())),
			Pid:            proto.Int32(int32(opts.PID)),
			LeaveRunning:   proto.Bool(opts.LeaveRunning),
			ShellJob:       proto.Bool(opts.ShellJob),
			FileLocks:      proto.Bool(opts.FileLocks),
			TcpClose:       proto.Bool(opts.TCPClose),
			TcpEstablished: proto.Bool(opts.TCPEstablished),
			LogLevel:       proto.Int32(level(opts.LogLevel)),
			LogFile:        proto.String(logFile),
			// Always on: a notification is how CRIU learns that kcr is gone
			// (see startSwrk).
			NotifyScripts: proto.Bool(true),
		},
	}
	if inChildUserNS() {
		req.Opts.Unprivileged = proto.Bool(true)
	}
	if p.ps != nil {
		// CRIU sends its pages to the page server, which writes them
		// into the same directory.
		req.Opts.Ps = &rpc.CriuPageServerInfo{Fd: proto.Int32(psFD)}
		if err := p.ps.start(ss.ctx, ss.path, dir, level(opts.LogLevel)); err != nil {
			p.sendErr = err
		}
	}
	if gated && p.sendErr == nil {
		// A failed send shows in Go, with CRIU's output.
		p.sendErr = p.s.send(req)
	} else {
		p.req = req
	}
	return p, nil
}

// Ready waits until CRIU has prepared (started, probed the kernel) and
// stopped at its pre-dump stage, where it waits for Go. A caller that
// disturbs the tree before the dump (its hooks) waits for Ready first, so
// that CRIU's preparation is not part of the disturbance. An error means
// CRIU failed before it touched the tree; the dump is over.
func (p *PendingDump) Ready(ctx context.Context) error {
	if p.s == nil {
		return errors.New("criu dump: pending dump already run or cancelled")
	}
	if !p.ready.IsZero() {
		return nil
	}
	if _, err := p.s.readVersion(); err != nil && p.sendErr == nil {
		p.sendErr = err
	}
	for p.sendErr == nil {
		resp, err := p.s.recv(rpc.CriuReqType_DUMP)
		if err != nil {
			p.sendErr = err
			break
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			p.final = resp // CRIU gave up before its pre-dump stage
			break
		}
		if nt := resp.GetNotify(); nt.GetScript() == "pre-dump" {
			p.ready, p.held = time.Now(), nt
			return nil
		}
		var ignored error
		if err := p.s.answer(resp.GetNotify(), p.opts.Notify, &ignored); err != nil {
			p.sendErr = err
		}
	}
	_, err := p.run(ctx, nil)
	if err == nil {
		err = errors.New("criu dump: CRIU answered before its pre-dump stage")
	}
	return err
}

// Go lets CRIU dump: it waits for CRIU's pre-dump stage (see Ready),
// passes it (and every later stage to opts.Notify, if set) and returns when
// CRIU answered, as Session.Dump does. DumpResult.Duration covers the
// request from Begin.
func (p *PendingDump) Go(ctx context.Context) (*DumpResult, error) {
	if err := p.Ready(ctx); err != nil {
		return nil, err
	}
	return p.run(ctx, p.opts.Notify)
}

// Cancel stops a pending dump that was not run: CRIU is killed before it
// seized the tree (it waits for Go at its pre-dump stage at the latest).
// It is a no-op after Go.
func (p *PendingDump) Cancel() {
	if p.s == nil {
		return
	}
	_ = p.s.cmd.Process.Kill()
	p.s.close()
	p.s = nil
	p.dir.Close()
	if p.ps != nil {
		_ = p.ps.finish(true)
	}
}

func (p *PendingDump) run(ctx context.Context, notify NotifyFunc) (*DumpResult, error) {
	s := p.s
	p.s = nil
	defer p.dir.Close()
	var resp *rpc.CriuResp
	callErr := p.sendErr
	stop := make(chan struct{})
	killed := watchDeadTarget(p.opts.PID, s.cmd.Process, stop)
	defer close(stop)
	if _, err := s.readVersion(); err != nil && callErr == nil {
		// The version answer comes first; without it the dump's is lost too.
		callErr = err
	}
	switch {
	case callErr != nil:
	case p.final != nil:
		resp = p.final
	case p.held != nil:
		// The pre-dump notification that Ready held back.
		var hookErr error
		if callErr = s.answer(p.held, notify, &hookErr); callErr == nil {
			resp, callErr = s.await(rpc.CriuReqType_DUMP, notify)
		}
		if callErr == nil {
			callErr = hookErr
		}
	case p.req != nil:
		resp, callErr = s.call(p.req, notify)
	default:
		resp, callErr = s.await(rpc.CriuReqType_DUMP, notify)
	}
	ok := resp.GetSuccess() && callErr == nil
	if p.ps != nil {
		// CRIU answered success only once the page server acknowledged
		// every page; it exits at once.
		if err := p.ps.finish(!ok); err != nil && ok {
			ok, callErr = false, err
		}
	}
	elapsed := time.Since(p.start)
	res := &DumpResult{Duration: elapsed, LogPath: p.logPath, Ready: p.ready}
	if ok {
		// CRIU answers once every image file is written and closed; its
		// exit (a few ms of teardown) overlaps with the caller's hashing
		// and sync instead of delaying them. Wait collects it.
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			_, _ = s.close()
		}()
		res.exited = exited
	} else {
		output, waitErr := s.close()
		if err := respError(ctx, "dump", resp, callErr, output, waitErr, p.logPath); err != nil {
			if killed.Load() {
				err = fmt.Errorf("%w: process %d died during the dump and CRIU had not finished %v later: killed it", err, p.opts.PID, deadTargetGrace)
			}
			return nil, err
		}
	}
	res.Stats, res.StatsErr = ReadDumpStats(p.opts.ImagesDir)
	return res, nil
}

// respError turns the outcome of one swrk request into an error (nil on
// success).
func respError(ctx context.Context, op string, resp *rpc.CriuResp, callErr error, output string, waitErr error, logPath string) error {
	if resp != nil && resp.GetSuccess() && callErr == nil {
		return nil
	}
	if ctx.Err() != nil {
		// criu was killed; whatever else went wrong follows from that.
		e := newError(op, logPath, "", fmt.Errorf("interrupted: %w", ctx.Err()))
		e.First, e.Cause, e.Hint = "", CauseUnknown, ""
		return e
	}
	var errs []error
	if callErr != nil {
		errs = append(errs, callErr)
	}
	rpcCause := CauseUnknown
	if resp != nil && !resp.GetSuccess() {
		msg := resp.GetCrErrmsg()
		if msg == "" {
			msg = "CRIU reported failure"
		}
		rpcCause, _ = classify(msg, true, CauseUnknown, len(causePatterns()))
		if no := syscall.Errno(resp.GetCrErrno()); no != 0 {
			msg = fmt.Sprintf("%s (errno %d)", msg, no)
			if no == syscall.ENOSPC || no == syscall.EDQUOT {
				rpcCause = CauseDiskFull
			}
		}
		errs = append(errs, errors.New(msg))
	}
	if resp == nil && waitErr != nil {
		errs = append(errs, fmt.Errorf("criu swrk: %w", waitErr))
	}
	if output != "" {
		errs = append(errs, fmt.Errorf("criu said: %s", strings.Join(strings.Fields(output), " ")))
	}
	e := newError(op, logPath, output, joinErrors(errs))
	if e.Cause == CauseUnknown && rpcCause != CauseUnknown {
		e.Cause, e.Hint = rpcCause, rpcCause.Hint()
	}
	var he *hookError
	if errors.As(callErr, &he) {
		e.First = he.Error() // CRIU only says "RPC client reported script error"
	}
	return e
}

// joinedError is errors.Join on one line.
type joinedError []error

func (j joinedError) Error() string {
	s := make([]string, len(j))
	for i, e := range j {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

func (j joinedError) Unwrap() []error { return j }

func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return joinedError(errs)
}
