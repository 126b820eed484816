package criu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// NotifyFunc is called for each CRIU action-script notification when set in
// DumpOptions or RestoreOptions. script is CRIU's name for the stage:
// "pre-dump", "query-ext-files", "post-dump" (dump, in that order; plus
// "network-lock"/"network-unlock" when the tree has its own network
// namespace), "pre-restore", "post-restore", "pre-resume", "post-resume"
// (restore, in that order; plus "setup-namespaces" and friends when
// namespaces are restored). pid is set for the stages that have one
// (post-restore: the restored root PID). Returning an error makes CRIU
// abort the operation (a failing "post-dump" on a leave-running dump, for
// example, resumes the tree and fails the dump).
type NotifyFunc func(script string, pid int) error

// maxMsg bounds one RPC message. CRIU's responses are small (a few hundred
// bytes); SEQPACKET truncates rather than splits, and we check MSG_TRUNC.
const maxMsg = 1 << 20

// swrk is one "criu swrk" child and our end of its socket.
type swrk struct {
	ctx     context.Context
	cmd     *exec.Cmd
	conn    *net.UnixConn
	stderr  *os.File // memfd collecting criu's stdout+stderr
	stop    func() bool
	buf     []byte        // for CRIU's messages
	unwatch func() bool   // stops watch's kill
	watches atomic.Uint64 // watch's calls: only the last one's kill counts
	// tree is set while a restore's tree is CRIU's and not whole: from the
	// restore request until kcr acknowledged post-restore. A kill of CRIU
	// then kills the tree too, which would otherwise wait in CRIU's
	// restorer for good, holding the image's PIDs.
	tree atomic.Bool
	// inherit are the caller's descriptors CRIU got, as fds 4, 5, … (for
	// RestoreOptions.Inherit).
	inherit []*os.File

	// The answer to the VERSION request askVersion sent, read once.
	verAsked, verRead bool
	ver               Version
	verErr            error
}

// askVersion sends a VERSION request that keeps CRIU open for the next
// request; readVersion reads its answer.
func (s *swrk) askVersion() {
	s.verAsked = true
	s.verErr = s.send(&rpc.CriuReq{Type: rpc.CriuReqType_VERSION.Enum(), KeepOpen: proto.Bool(true)})
}

// readVersion returns CRIU's answer to askVersion, reading it the first
// time. Without askVersion it returns a zero Version and no error.
func (s *swrk) readVersion() (Version, error) {
	if !s.verAsked || s.verRead {
		return s.ver, s.verErr
	}
	s.verRead = true
	if s.verErr != nil {
		return s.ver, s.verErr
	}
	resp, err := s.await(rpc.CriuReqType_VERSION, nil)
	switch {
	case err != nil:
		s.verErr = err
	case resp.GetType() != rpc.CriuReqType_VERSION || !resp.GetSuccess() || resp.GetVersion() == nil:
		s.verErr = fmt.Errorf("criu swrk answered its VERSION request with a %s response (success %v)", resp.GetType(), resp.GetSuccess())
	default:
		v := resp.GetVersion()
		s.ver = Version{Major: int(v.GetMajorNumber()), Minor: int(v.GetMinorNumber()), Sublevel: int(v.GetSublevel()), GitID: v.GetGitid()}
	}
	return s.ver, s.verErr
}

// startSwrk starts "criu swrk 3". The socketpair is created close-on-exec;
// the child's end is handed over as fd 3 through ExtraFiles (dup2'd without
// CLOEXEC in the child only; inherit, if any, as fds 4 and up), so neither end
// leaks into other children that
// the program starts concurrently. With hangUpOnCancel (dumps), cancelling
// ctx shuts the socket down, so that CRIU fails its next notification and
// aborts; without it (restores), a cancelled ctx leaves CRIU's next
// notification unanswered, with the same effect.
func startSwrk(ctx context.Context, criuPath string, ownGroup, hangUpOnCancel bool, inherit ...*os.File) (*swrk, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("criu: socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "criu-swrk")
	theirs := os.NewFile(uintptr(fds[1]), "criu-swrk-child")
	defer theirs.Close()

	c, err := net.FileConn(ours) // dups (CLOEXEC); ours is closed below
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("criu: swrk socket: %w", err)
	}
	conn := c.(*net.UnixConn)

	out, err := memfd("criu-swrk-output")
	if err != nil {
		conn.Close()
		return nil, err
	}

	cmd := exec.Command(criuPath, "swrk", "3")
	// inherit follow as fds 4, 5, ... (a page server's socket, a
	// restore's inherited pipes).
	cmd.ExtraFiles = append([]*os.File{theirs}, inherit...)
	cmd.Stdout = out
	cmd.Stderr = out
	// Keep terminal signals (Ctrl-C in kcr's terminal) away from CRIU: a
	// half-done dump must not be interrupted behind our back. Not for shell
	// jobs, which are restored into CRIU's session and process group.
	//
	// CRIU never dies with kcr (no Pdeathsig): killed while it works on a
	// tree, it leaves the tree seized or with its parasite half injected,
	// and the process dies (SIGTRAP in the parasite) or hangs. CRIU learns
	// of kcr's death from the socket instead: kcr's end closes with kcr,
	// and CRIU (which ignores SIGPIPE) fails to send its next notification.
	// A dump always has notifications on, so that next one comes at the
	// latest at post-dump: CRIU then cures its parasite, resumes the tree
	// and reports "Dumping FAILED"; before its pre-dump stage it has not
	// touched the tree, and once kcr answered post-dump the dump is
	// complete for "kcr recover". A restore aborts the same way and kills
	// the tasks it forked, where a killed CRIU would leave each half-built
	// task waiting forever in its restorer, holding the image's PIDs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: ownGroup}
	err = cmd.Start()
	if err != nil {
		conn.Close()
		out.Close()
		return nil, fmt.Errorf("criu: start %s swrk: %w", criuPath, err)
	}
	s := &swrk{ctx: ctx, cmd: cmd, conn: conn, stderr: out, inherit: inherit}
	s.stop = func() bool { return false }
	if hangUpOnCancel {
		s.stop = context.AfterFunc(ctx, s.hangUp)
	}
	s.watch(ctx)
	return s, nil
}

// KillGrace is how long CRIU has to exit once the context of its request
// ended (a deadline, a shutdown) before kcr kills it. A working CRIU aborts
// at its next notification, within milliseconds, and cures and resumes a
// tree it seized; one that does not (stopped, or stuck on a hung volume
// with the tree frozen) is killed: the kernel then detaches the tree, which
// runs on, or dies if CRIU's parasite was in it; it is never left frozen.
// A restoring CRIU is killed with the tasks it forked, unless they were
// already told to run (post-restore): a task in CRIU's restorer never
// runs without CRIU (one whose capset failed waits there for good).
var KillGrace = 10 * time.Second

// watch makes ctx the context of CRIU's request: once it ends, CRIU is
// killed if it has not exited KillGrace later, which also ends our wait
// for its answer (its socket closes with it).
func (s *swrk) watch(ctx context.Context) {
	if s.unwatch != nil {
		s.unwatch()
	}
	s.ctx = ctx
	proc, gen, grace := s.cmd.Process, s.watches.Add(1), KillGrace
	s.unwatch = context.AfterFunc(ctx, func() {
		time.AfterFunc(grace, func() {
			// Not if a later request took CRIU over meanwhile (a
			// session started ahead, then its restore); a no-op once
			// CRIU is reaped.
			if s.watches.Load() == gen {
				if s.tree.Load() {
					killForked(proc)
				}
				_ = proc.Kill()
			}
		})
	})
}

// killForked kills what CRIU forked, leaves first. CRIU is stopped
// first, so that it neither forks more nor reaps one of them, whose PID
// could then be reused before the kill; a task in the restorer reaps
// nothing either.
func killForked(criu *os.Process) {
	if criu.Signal(syscall.SIGSTOP) != nil {
		return // gone already
	}
	tree := procfs.Tree(criu.Pid)
	for i := len(tree) - 1; i > 0; i-- {
		_ = unix.Kill(tree[i], unix.SIGKILL)
	}
}

// hangUp shuts our end of CRIU's socket down, as kcr's death would: CRIU
// reads EOF and fails to send, so it aborts at its next notification (and
// cures and resumes a tree it seized); our pending read returns at once.
func (s *swrk) hangUp() {
	rc, err := s.conn.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) { err = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
	}
	if err != nil {
		_ = s.conn.SetDeadline(time.Unix(1, 0))
	}
}

func memfd(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("criu: memfd_create: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// call sends req and returns CRIU's final response, answering NOTIFY
// messages in between with notify (if nil, every notification is
// acknowledged). If a hook failed, the final response is returned together
// with the hook's error. A response with success=false is otherwise returned
// with a nil error; the caller turns it into an *Error with the log.
func (s *swrk) call(req *rpc.CriuReq, notify NotifyFunc) (*rpc.CriuResp, error) {
	if err := s.send(req); err != nil {
		return nil, err
	}
	return s.await(req.GetType(), notify)
}

// send writes one request (or notification answer) to CRIU.
func (s *swrk) send(req *rpc.CriuReq) error {
	b, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("criu: marshal request: %w", err)
	}
	if _, err := s.conn.Write(b); err != nil {
		return fmt.Errorf("criu: send %s request: %w", req.GetType(), err)
	}
	return nil
}

// await reads CRIU's messages for the request of type typ that was sent,
// answering notifications as call does, until the final response.
func (s *swrk) await(typ rpc.CriuReqType, notify NotifyFunc) (*rpc.CriuResp, error) {
	var notifyErr error
	for {
		resp, err := s.recv(typ)
		if err != nil {
			return nil, err
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			return resp, notifyErr
		}
		if err := s.answer(resp.GetNotify(), notify, &notifyErr); err != nil {
			return nil, err
		}
	}
}

// recv reads one message from CRIU, which is working on a request of
// type typ.
func (s *swrk) recv(typ rpc.CriuReqType) (*rpc.CriuResp, error) {
	if s.buf == nil {
		s.buf = make([]byte, maxMsg)
	}
	n, _, flags, _, err := s.conn.ReadMsgUnix(s.buf, nil)
	if err != nil {
		if errors.Is(err, io.EOF) || n == 0 {
			return nil, fmt.Errorf("criu swrk exited without answering the %s request", typ)
		}
		return nil, fmt.Errorf("criu: read response: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("criu swrk exited without answering the %s request", typ)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("criu: response larger than %d bytes", maxMsg)
	}
	resp := &rpc.CriuResp{}
	if err := proto.Unmarshal(s.buf[:n], resp); err != nil {
		return nil, fmt.Errorf("criu: unmarshal response: %w", err)
	}
	return resp, nil
}

// answer runs notify (if set) for CRIU's notification nt and tells CRIU
// whether it succeeded; a failure of notify is kept in *notifyErr.
func (s *swrk) answer(nt *rpc.CriuNotify, notify NotifyFunc, notifyErr *error) error {
	ok := true
	if notify != nil {
		if err := notify(nt.GetScript(), int(nt.GetPid())); err != nil {
			*notifyErr = &hookError{script: nt.GetScript(), err: err}
			ok = false
		}
	}
	if err := s.ctx.Err(); err != nil {
		// Unanswered: once close shuts our end, CRIU aborts (a
		// restoring CRIU kills the tasks it forked; killing it instead
		// would strand them in its restorer).
		return err
	}
	err := s.send(&rpc.CriuReq{
		Type:          rpc.CriuReqType_NOTIFY.Enum(),
		NotifySuccess: proto.Bool(ok),
	})
	if err == nil && ok && nt.GetScript() == "post-restore" {
		s.tree.Store(false) // CRIU no longer aborts: the tree runs
	}
	return err
}

// close shuts the socket (criu swrk exits on EOF), waits for the process and
// returns what it printed. The error, if any, is the wait status.
func (s *swrk) close() (output string, err error) {
	s.conn.Close()
	err = s.cmd.Wait()
	s.stop()
	if _, serr := s.stderr.Seek(0, io.SeekStart); serr == nil {
		b, _ := io.ReadAll(io.LimitReader(s.stderr, 64<<10))
		output = strings.TrimSpace(string(b))
	}
	s.stderr.Close()
	return output, err
}

// hookError is a NotifyFunc's failure.
type hookError struct {
	script string
	err    error
}

func (e *hookError) Error() string { return e.script + " hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }
