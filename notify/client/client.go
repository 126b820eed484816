// Package client is the kcr CLI's side of the control socket: it finds a
// process's socket from its PID and drives the checkpoint protocol.
package client

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/proto"
)

// ErrNoSocket is returned by Find for a process without a kcr control
// socket; a PID that does not exist gives proto.ErrNoProcess.
var ErrNoSocket = errors.New("no kcr control socket")

// ErrPending is returned by Resume and Restored when the app did not finish
// its after-restore hooks within the wait; the hooks go on in the app.
var ErrPending = errors.New("after-restore hooks still pending")

// Find returns the control socket of process pid. It looks at the
// process's own fds and matches their socket inodes against
// /proc/<pid>/net/unix, so it works across PID and mount namespaces. The
// socket's path is the one the process bound, in its own mount namespace;
// the Socket's methods reach it through /proc/<pid>/root and check that the
// process (or a child) of the right user answers.
func Find(pid int) (*Socket, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("PID %d: %w", pid, proto.ErrNoProcess)
	}
	proc := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(proc + "/fd")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("PID %d: %w: check the PID (ps -p %d)", pid, proto.ErrNoProcess, pid)
		}
		return nil, fmt.Errorf("read fds of PID %d: %w (run kcr as root or as the process owner)", pid, err)
	}
	inodes := map[string]bool{}
	for _, e := range ents {
		l, err := os.Readlink(proc + "/fd/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	paths, err := listeningUnix(proc+"/net/unix", inodes)
	if err != nil {
		return nil, fmt.Errorf("PID %d: %w", pid, err)
	}
	// A clone restored in a PID namespace briefly holds the image's socket
	// and then its own, named after its PID: prefer that one.
	own := proto.SocketName(pid)
	slices.SortStableFunc(paths, func(a, b string) int {
		return cmp.Compare(b2i(filepath.Base(b) == own), b2i(filepath.Base(a) == own))
	})
	for _, p := range paths {
		if !proto.IsSocketName(p) {
			continue
		}
		return &Socket{PID: pid, Path: p}, nil
	}
	return nil, fmt.Errorf("process %d (%s) has %w: link github.com/kcr-dev/kcr/notify and call notify.Start, or pass --no-hooks to dump it without hooks",
		pid, comm(pid), ErrNoSocket)
}

// listeningUnix returns the bound paths of listening Unix sockets in a
// /proc/net/unix table whose inodes are in want.
func listeningUnix(table string, want map[string]bool) ([]string, error) {
	f, err := os.Open(table)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseUnixTable(f, want)
}

// ErrUnsafeSocket is returned when a process's control socket cannot be
// trusted: its path is ambiguous or holds control characters, it is
// reached through a symlink, or another process answers on it.
var ErrUnsafeSocket = errors.New("untrusted control socket")

// parseUnixTable reads a /proc/net/unix table. The kernel prints sun_path
// raw, so a path with a newline forges lines: a wanted inode on two lines,
// or a wanted path with a control character, fails the whole table.
func parseUnixTable(r io.Reader, want map[string]bool) ([]string, error) {
	const acceptCon = 0x10000 // __SO_ACCEPTCON: listening
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		// Num RefCount Protocol Flags Type St Inode [Path]. The kernel
		// prints the path raw after one space, so it may hold runs of
		// spaces or end in one: cut it from the line, do not re-join fields.
		line := sc.Text()
		var f [7]string
		rest := line
		ok := true
		for i := range f {
			rest = strings.TrimLeft(rest, " ")
			end := strings.IndexByte(rest, ' ')
			if end < 0 {
				end = len(rest)
			}
			f[i], rest = rest[:end], rest[end:]
			if f[i] == "" {
				ok = false
				break
			}
		}
		if !ok || !want[f[6]] {
			continue
		}
		if seen[f[6]] {
			return nil, fmt.Errorf("%w: socket inode %s appears twice in the socket table (a bound path holds a newline)", ErrUnsafeSocket, f[6])
		}
		seen[f[6]] = true
		if !strings.HasPrefix(rest, " ") {
			continue
		}
		path := rest[1:]
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil || flags&acceptCon == 0 || !strings.HasPrefix(path, "/") {
			continue // not listening, or unbound or abstract ('@')
		}
		if i := strings.IndexFunc(path, isControl); i >= 0 {
			return nil, fmt.Errorf("%w: listening socket path %q holds a control character", ErrUnsafeSocket, path)
		}
		out = append(out, path)
	}
	return out, sc.Err()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// dialer connects to a control socket.
type dialer func(ctx context.Context) (*net.UnixConn, error)

// dialPath connects to path as it is.
func dialPath(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := d.DialContext(cctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return nc.(*net.UnixConn), nil
}

// atPath dials a path the caller trusts.
func atPath(path string) dialer {
	return func(ctx context.Context) (*net.UnixConn, error) {
		c, err := dialPath(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("connect to control socket %s: %w", path, err)
		}
		return c, nil
	}
}

// call sends one request and reads one answer.
func call(ctx context.Context, dial dialer, path string, req proto.Message, timeout time.Duration) (proto.Message, *net.UnixConn, error) {
	c, err := dial(ctx)
	if err != nil {
		return proto.Message{}, nil, err
	}
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := proto.Write(c, req); err != nil {
		// The app may have answered (a refusal) and closed before taking
		// the request: its answer is more telling than EPIPE.
		if resp, rerr := proto.Read(c); rerr == nil && resp.Type == proto.TypeError {
			c.Close()
			return resp, nil, refused(req.Type, resp.Error)
		}
		c.Close()
		return proto.Message{}, nil, fmt.Errorf("send %s to %s: %w", req.Type, path, err)
	}
	resp, err := proto.Read(c)
	if err != nil {
		c.Close()
		if cerr := ctx.Err(); cerr != nil {
			// The caller gave up (or was interrupted): say so, rather than
			// passing it off as the app being slow.
			return proto.Message{}, nil, fmt.Errorf("waiting for the answer to %s from %s: %w", req.Type, path, context.Cause(ctx))
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return proto.Message{}, nil, fmt.Errorf("no answer to %s from %s within %v: %w", req.Type, path, timeout, context.DeadlineExceeded)
		}
		return proto.Message{}, nil, fmt.Errorf("read answer to %s from %s: %w", req.Type, path, err)
	}
	if resp.Type == proto.TypeError {
		c.Close()
		return resp, nil, refused(req.Type, resp.Error)
	}
	return resp, c, nil
}

// refused is the error for an app's error reply to a request of type typ:
// one that wraps proto.ErrUnknownType when the app does not know the type
// (an older notify library).
func refused(typ, reply string) error {
	unknown := proto.ErrBadMessage.Error() + ": " + proto.ErrUnknownType.Error()
	if rest, ok := strings.CutPrefix(reply, unknown); ok {
		return fmt.Errorf("app refused %s: %w: %w%s", typ, proto.ErrBadMessage, proto.ErrUnknownType, rest)
	}
	return fmt.Errorf("app refused %s: %s", typ, reply)
}

// Hello asks the app listening on path, which the caller trusts, who it is.
// Use [Find] and the [Socket]'s methods for another user's process.
func Hello(ctx context.Context, path string) (proto.Message, error) {
	return hello(ctx, atPath(path), path)
}

func hello(ctx context.Context, dial dialer, path string) (proto.Message, error) {
	m, c, err := call(ctx, dial, path, proto.Message{Type: proto.TypeHello}, 5*time.Second)
	if c != nil {
		c.Close()
	}
	return m, err
}

// CheckpointRequest is what the CLI asks of the app.
type CheckpointRequest struct {
	HookBudget   time.Duration // deadline of the before-checkpoint hooks
	ResumeAfter  time.Duration // the app resumes by itself if no follow-up comes in this time
	LeaveRunning bool
	// RequireDrained makes a resource that would carry records into the
	// image veto the checkpoint (notify.CarryError).
	RequireDrained bool
}

// Checkpoint asks the app to run its before-checkpoint hooks. If they fail
// it returns a *proto.HookFailure (the app has resumed every resource). On
// success the app has answered "ready" and closed its end of the connection
// (Checkpoint waits for that close), so the process can be dumped. path is trusted as
// for [Hello].
func Checkpoint(ctx context.Context, path string, req CheckpointRequest) (proto.Message, error) {
	return checkpoint(ctx, atPath(path), path, req)
}

func checkpoint(ctx context.Context, dial dialer, path string, req CheckpointRequest) (proto.Message, error) {
	// The app runs its hooks for up to its own default when we send none.
	budget := req.HookBudget
	if budget <= 0 {
		budget = proto.DefaultHookBudget
	}
	// Named for an app in a PID namespace of its own, which cannot see
	// kcr's PID through SO_PEERCRED but can watch this one.
	pid, start, _ := procfs.Self()
	m, c, err := call(ctx, dial, path, proto.Message{Type: proto.TypeCheckpoint, HookBudget: req.HookBudget,
		ResumeAfter: req.ResumeAfter, Leave: req.LeaveRunning, RequireDrained: req.RequireDrained, KCRPID: pid, KCRStart: start}, budget+5*time.Second)
	if err != nil {
		return m, err
	}
	defer c.Close()
	switch m.Type {
	case proto.TypeReady:
	case proto.TypeBusy:
		return m, fmt.Errorf("%w: wait for it to finish", proto.ErrBusy)
	case proto.TypeFailed:
		return m, &proto.HookFailure{Reports: m.Reports, Msg: m.Error}
	default:
		return m, fmt.Errorf("unexpected answer %q to checkpoint", m.Type)
	}
	// The app closes its end right after "ready"; wait for EOF so that CRIU
	// never sees a live half of this connection.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		return m, fmt.Errorf("app did not close the control connection after ready: %v", err)
	}
	return m, nil
}

// Resume tells the app that the checkpoint is over and it goes on (the dump
// failed, or --leave-running). It waits up to wait (0: the app's default
// after-restore budget and a margin) for the after-restore hooks and returns
// their reports, or ErrPending.
func Resume(ctx context.Context, path, reason string, wait time.Duration) (proto.Message, error) {
	return followup(ctx, atPath(path), path, proto.Message{Type: proto.TypeResume, Reason: reason, Wait: wait}, wait)
}

// Restored tells a restored process that it is a new instance, with its
// restore generation. It waits like Resume.
func Restored(ctx context.Context, path string, generation uint64, wait time.Duration) (proto.Message, error) {
	return RestoredAs(ctx, path, generation, "", wait)
}

// RestoredAs is Restored for a clone that kcr restore --name named.
func RestoredAs(ctx context.Context, path string, generation uint64, name string, wait time.Duration) (proto.Message, error) {
	return followup(ctx, atPath(path), path, proto.Message{Type: proto.TypeRestored, Generation: generation, Name: name, Wait: wait}, wait)
}

func followup(ctx context.Context, dial dialer, path string, req proto.Message, wait time.Duration) (proto.Message, error) {
	if wait <= 0 {
		// A zero timeout would give up before the request is even read.
		wait = proto.DefaultAfterBudget + 5*time.Second
	}
	m, c, err := call(ctx, dial, path, req, wait)
	if c != nil {
		c.Close()
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return m, fmt.Errorf("%w after %v: the app goes on with them (see its log)", ErrPending, wait)
		}
		return m, err
	}
	if m.Type != proto.TypeDone {
		return m, fmt.Errorf("unexpected answer %q to %s", m.Type, req.Type)
	}
	if m.Error != "" {
		return m, fmt.Errorf("after-restore hooks failed: %s", m.Error)
	}
	return m, nil
}

// Activity asks the app for its activity counters (notify.Activity): the
// answer is a TypeInfo message with Activity, OpenConns and HooksInFlight.
// An app whose notify library predates the request refuses it.
func Activity(ctx context.Context, path string) (proto.Message, error) {
	return activity(ctx, atPath(path), path)
}

func activity(ctx context.Context, dial dialer, path string) (proto.Message, error) {
	m, c, err := call(ctx, dial, path, proto.Message{Type: proto.TypeActivity}, 5*time.Second)
	if c != nil {
		c.Close()
	}
	if err != nil {
		return m, err
	}
	if m.Type != proto.TypeInfo {
		return m, fmt.Errorf("unexpected answer %q to activity", m.Type)
	}
	return m, nil
}
