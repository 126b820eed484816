package criuaction

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/client"
)

// state is what pre-dump leaves for post-dump and the watcher, in a file
// named after CRIU's PID (post-dump is run by the same CRIU).
type state struct {
	CRIUPID   int       `json:"criu_pid"`
	CRIUStart uint64    `json:"criu_start_time"`
	InitPID   int       `json:"init_pid"`
	Targets   []Target  `json:"targets"`
	Deadline  time.Time `json:"deadline"` // the apps resume by themselves then
	Dumped    bool      `json:"dumped"`   // post-dump ran: the dump succeeded
	ImageDir  string    `json:"image_dir,omitempty"`
}

func stateFile(o Options, criuPID int) string {
	return filepath.Join(o.StateDir, "criu-"+strconv.Itoa(criuPID)+".json")
}

func writeState(o Options, st state) (string, error) {
	root, err := openStateDir(o.StateDir, true)
	if err != nil {
		return "", err
	}
	defer root.Close()
	b, err := json.Marshal(st)
	if err != nil {
		return "", err
	}
	p := stateFile(o, st.CRIUPID)
	if err := writeStateFile(root, filepath.Base(p), b); err != nil {
		return "", fmt.Errorf("criu-hook state: %w", err)
	}
	return p, nil
}

// readState reads the state file p, in a state directory that passes
// openStateDir.
func readState(p string) (state, error) {
	var st state
	root, err := openStateDir(filepath.Dir(p), false)
	if err != nil {
		return st, err
	}
	defer root.Close()
	b, err := readStateFile(root, filepath.Base(p))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("criu-hook state %s: %w", p, err)
	}
	return st, nil
}

// removeState removes the state file p through its directory.
func removeState(p string) {
	if root, err := openStateDir(filepath.Dir(p), false); err == nil {
		root.Remove(filepath.Base(p))
		root.Close()
	}
}

// Watch waits until the CRIU named in the state file has exited, then sends
// Resume to every app of the file that still runs (the dump failed, or left
// the tree running) and removes the file. Apps that were dumped are gone.
// It gives up at the state's deadline, when the apps resume by themselves.
//
// If gate is not nil, Watch first reads it to its end (pre-dump's pipe,
// closed once the hooks are done) and returns at once unless it said
// go: the checkpoint was aborted, and pre-dump resumed the apps itself.
func Watch(ctx context.Context, file string, gate io.Reader, o Options) error {
	o.defaults()
	log := o.Logger
	if gate != nil {
		b, _ := io.ReadAll(io.LimitReader(gate, 16))
		if string(b) != watchGo {
			log.Debug("criu-hook watch: the checkpoint was aborted, nothing to watch")
			return nil
		}
	}
	st, err := readState(file)
	if err != nil {
		return err
	}
	defer removeState(file)
	ctx, cancel := context.WithDeadline(ctx, st.Deadline)
	defer cancel()
	if err := waitExit(ctx, st.CRIUPID, st.CRIUStart); err != nil {
		return fmt.Errorf("waiting for CRIU (PID %d) to finish: %w; the apps resume by themselves", st.CRIUPID, err)
	}
	if s, err := readState(file); err == nil {
		st.Dumped = s.Dumped
	}
	// The installed script skips post-dump (a kcr start while the tree is
	// frozen); CRIU writes its inventory last, once the dump succeeded.
	if _, err := os.Stat(filepath.Join(st.ImageDir, "inventory.img")); err == nil && st.ImageDir != "" {
		st.Dumped = true
	}
	reason := "dump failed"
	if st.Dumped {
		reason = "leave-running"
	}
	which := make([]bool, len(st.Targets))
	n := 0
	for i, t := range st.Targets {
		// A dumped and killed app is gone, or a zombie without fds.
		if startTime(t.PID) != t.StartTime {
			continue
		}
		if _, err := client.Find(t.PID); err != nil {
			continue
		}
		which[i] = true
		n++
	}
	if n == 0 {
		log.Debug("criu-hook watch: every app was dumped", "criu_pid", st.CRIUPID)
		return nil
	}
	resumeAll(st.Targets, which, reason, o)
	return nil
}

// waitExit waits until process pid, started at start, has exited.
func waitExit(ctx context.Context, pid int, start uint64) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return err
	}
	defer unix.Close(fd)
	if startTime(pid) != start {
		return nil // the PID was reused: ours is gone
	}
	for {
		ms := 1000
		if dl, ok := ctx.Deadline(); ok {
			ms = max(0, min(ms, int(time.Until(dl).Milliseconds())))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if n > 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func startTime(pid int) uint64 {
	st, _ := procfs.StartTime(pid)
	return st
}

// spawnWatcher runs this executable as "criu-hook watch FILE" in a session
// of its own. It inherits stderr (CRIU's log) and, as stdin, a pipe that
// commit closes: Watch reads the outcome there first.
func spawnWatcher(file string) (func(bool), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, "criu-hook", "watch", file)
	cmd.Stdin, cmd.Stderr = r, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start %s criu-hook watch: %w", exe, err)
	}
	cmd.Process.Release()
	return func(ok bool) {
		if ok {
			w.Write([]byte(watchGo))
		}
		w.Close()
	}, nil
}

// watchGo, on the watcher's gate, says the state file is written.
const watchGo = "go"
