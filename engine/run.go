package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
)

// logFix is the advice when a log's directory is refused.
const logFix = "another user could point the log at a file of root's: give a directory only root can write"

// RunOptions configures Run.
type RunOptions struct {
	Args []string // program and arguments
	// Log receives the program's stdout and stderr, opened with O_APPEND
	// (CRIU cannot restore a regular file that grew after the dump unless it
	// is append-only). Default: ./NAME.log.
	Log string
	// Stdout and Stderr, if set, are the program's stdout and stderr in
	// place of Log (kcr standby's log pipes: see RestoreOptions.Stdout).
	Stdout, Stderr *os.File
	// NoPIDNamespace runs the program in the host's PID namespace; it then
	// cannot be restored more than once at a time.
	NoPIDNamespace bool
	// Env is added to the environment. GODEBUG=multipathtcp=0 is added
	// unless GODEBUG already sets multipathtcp.
	Env []string
	// ReadyTimeout is how long to wait for the program's kcr control
	// socket (0: do not wait).
	ReadyTimeout time.Duration
	// ExtraFiles are passed to the program as fds 3, 4, … (a listening
	// socket for LISTEN_FDS).
	ExtraFiles []*os.File
	// Cred is the uid, gid and supplementary groups the program runs as
	// (nil: kcr's own). ParseUser makes one.
	Cred *syscall.Credential
	// Caps are the capabilities the program keeps (ParseCaps): in its
	// bounding set, and ambient, so that a non-root uid keeps them. Every
	// other capability is dropped from its bounding set, its inheritable
	// and ambient sets are otherwise empty, and it runs with
	// no_new_privs: it can gain none by execve. CRIU restores a process's
	// capabilities as they were dumped, so its restored copies keep these.
	// In a PID namespace of its own the program always keeps
	// CAP_SYS_ADMIN: CRIU's dump mounts a proc of that namespace from
	// inside the program, with its credentials (docs/kubernetes.md).
	Caps []uintptr
	// AllCaps runs the program with kcr's own capabilities and without
	// no_new_privs (Caps is then ignored).
	AllCaps bool
}

// RunResult describes a started service.
type RunResult struct {
	PID    int    // host PID
	Log    string // absolute path of the log
	Socket string // control socket, if it appeared within ReadyTimeout
	// Exited receives how the program ended once it did (kcr reaps it
	// while kcr runs).
	Exited <-chan *os.ProcessState
}

// ErrNoSocketYet is returned by Run when the program runs but opened no kcr
// control socket within the ready timeout.
var ErrNoSocketYet = errors.New("no kcr control socket yet")

// Run starts a service so that it can be checkpointed and cloned: in a PID
// namespace of its own where it is init (no mount namespace, so /proc and
// paths stay the host's), as leader of its own session, with stdin from
// /dev/null and its output appended to a log. kcr keeps no fd of it and
// does not wait for it. The program gets no descriptor of kcr's but
// ExtraFiles: Run marks those kcr inherited close-on-exec first
// (CloseInheritedFDs).
func Run(ctx context.Context, o RunOptions) (*RunResult, error) {
	if len(o.Args) == 0 {
		return nil, errors.New("no program given: kcr run [flags] -- PROG ARGS")
	}
	prog, err := exec.LookPath(o.Args[0])
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("program %q: %w: give its path, or a name found in $PATH", o.Args[0], syscall.ENOENT)
	}
	if err != nil {
		return nil, fmt.Errorf("program %q: %w", o.Args[0], err)
	}
	stdout, stderr, logPath, err := runOutput(o)
	if err != nil {
		return nil, err
	}
	if logPath != "" {
		defer stdout.Close()
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer null.Close()

	if err := CloseInheritedFDs(); err != nil {
		return nil, fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	cmd := runCmd(prog, o, null, stdout, stderr)
	if o.AllCaps {
		err = cmd.Start()
	} else {
		err = startConfined(cmd, serviceCaps(o.Caps, !o.NoPIDNamespace))
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", o.Args[0], err)
	}
	ps := make(chan *os.ProcessState, 1)
	res := &RunResult{PID: cmd.Process.Pid, Log: logPath, Exited: ps}
	// Reap it if it dies while we wait; once kcr exits, init adopts it.
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		ps <- cmd.ProcessState
		exited <- err
	}()
	if o.ReadyTimeout <= 0 {
		return res, nil
	}
	deadline := time.NewTimer(o.ReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("%s exited at start (%v): see %s", o.Args[0], err, logName(logPath))
		case <-ctx.Done():
			return res, ctx.Err()
		case <-deadline.C:
			return res, fmt.Errorf("%s (PID %d) runs, but %w after %v: does it call notify.Start?", o.Args[0], res.PID, ErrNoSocketYet, o.ReadyTimeout)
		case <-tick.C:
			if p, err := client.Find(res.PID); err == nil {
				res.Socket = p.Path
				return res, nil
			}
		}
	}
}

// runOutput returns the program's stdout and stderr: o's, or its log
// opened, with the log's path (the caller closes it).
func runOutput(o RunOptions) (stdout, stderr *os.File, logPath string, err error) {
	if o.Stdout != nil || o.Stderr != nil {
		return o.Stdout, o.Stderr, "", nil
	}
	logPath = o.Log
	if logPath == "" {
		logPath = filepath.Base(o.Args[0]) + ".log"
	}
	if logPath, err = filepath.Abs(logPath); err != nil {
		return nil, nil, "", err
	}
	logf, err := OpenRunLog(logPath)
	if err != nil {
		return nil, nil, "", err
	}
	return logf, logf, logPath, nil
}

func logName(logPath string) string {
	if logPath == "" {
		return "its output"
	}
	return logPath
}

// OpenRunLog opens (creating it) the log of a service for appending, as
// Run does: not through a symlink, in the log's name or in any directory
// above it, and as root only in directories no other user can write (kcr
// runs as root, the log's directory may not be root's); a FIFO or device
// is refused too. Its errors are one line naming the fix.
func OpenRunLog(logPath string) (*os.File, error) {
	logPath, err := filepath.Abs(logPath)
	if err != nil {
		return nil, err
	}
	logf, err := images.OpenOutput(logPath, true, logFix)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("open log %s: it is a symlink: give the real path (kcr does not follow links for its logs)", logPath)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open log %s: directory %s: %w: create it first, or give another --log", logPath, filepath.Dir(logPath), syscall.ENOENT)
	}
	if errors.Is(err, images.ErrUntrusted) {
		return nil, fmt.Errorf("open log: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w: give a regular file's path", logPath, err)
	}
	return logf, nil
}

// runCmd is the command Run starts: prog with o's arguments, environment,
// credentials and ExtraFiles, in a session (and by default a PID
// namespace) of its own.
func runCmd(prog string, o RunOptions, null, stdout, stderr *os.File) *exec.Cmd {
	env := RunEnv(o.Env)
	if o.Cred != nil && int(o.Cred.Uid) != os.Getuid() {
		// kcr's runtime directory is not the program's: its kcr control
		// socket goes to its own (notify.WithSocketDir).
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "XDG_RUNTIME_DIR=") })
	}
	cmd := exec.Command(prog, o.Args[1:]...)
	cmd.Args[0] = o.Args[0]
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, stdout, stderr
	cmd.ExtraFiles = o.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: o.Cred}
	if !o.NoPIDNamespace {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	return cmd
}

// RunEnv is the environment Run gives a program: kcr's own, then extra,
// then GODEBUG=multipathtcp=0 unless GODEBUG sets multipathtcp already
// (CRIU cannot dump an MPTCP socket).
func RunEnv(extra []string) []string {
	env := append(os.Environ(), extra...)
	if !strings.Contains(lastValue(env, "GODEBUG"), "multipathtcp=") {
		godebug := lastValue(env, "GODEBUG")
		if godebug != "" {
			godebug += ","
		}
		env = append(env, "GODEBUG="+godebug+"multipathtcp=0")
	}
	return env
}

func lastValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// clearNonblock undoes the O_NONBLOCK that kept open from blocking on a FIFO.
func clearNonblock(f *os.File) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = syscall.SetNonblock(int(fd), false) }); err != nil {
		return err
	}
	return serr
}
