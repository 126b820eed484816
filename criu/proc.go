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

	"github.com/kcr-dev/kcr/internal/procfs"
)

// procStat holds the fields of /proc/<pid>/stat kcr uses.
type procStat = procfs.Stat

func readProcStat(pid int) (*procStat, error) { return procfs.ReadStat(pid) }

func parseProcStat(b []byte) (*procStat, error) { return procfs.ParseStat(b) }

// ShellJobNeeded reports whether CRIU needs --shell-job (ShellJob) to dump
// pid: the process has a controlling terminal (tty_nr in /proc/<pid>/stat is
// not 0), or it is not the leader of its own session (its session leads
// outside the tree and CRIU refuses: "not a session leader"). A service
// started detached (setsid, stdin from /dev/null) needs neither. Such jobs
// restore badly: prefer starting the service detached.
func ShellJobNeeded(pid int) (bool, error) {
	st, err := readProcStat(pid)
	if err != nil {
		return false, fmt.Errorf("criu: process %d: %w", pid, err)
	}
	return st.TTYNr != 0 || st.Session != pid, nil
}

// WaitGone waits, for at most timeout, until /proc/<pid> is gone: not
// running and not a zombie either. After a dump without LeaveRunning CRIU
// kills the tree, but its PIDs stay taken until the parent reaps the zombies
// (PID 1 may take a second or two), and a restore before that fails with
// "Can't fork for <pid>: File exists". It returns how long it waited. A
// process's zombie is only reaped by its parent: if the parent is the
// calling program, it must Wait for it itself.
func WaitGone(ctx context.Context, pid int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	first, err := readProcStat(pid)
	if err != nil {
		// A task being torn down answers ESRCH before its /proc entry goes.
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return 0, nil
		}
		return 0, fmt.Errorf("criu: process %d: %w", pid, err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := readProcStat(pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				return time.Since(start), nil
			}
			return time.Since(start), fmt.Errorf("criu: process %d: %w", pid, err)
		}
		if st.StartTime != first.StartTime {
			return time.Since(start), nil // gone; the PID now belongs to someone else
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-deadline.C:
			what := fmt.Sprintf("process %d (%q) is still running", pid, st.Comm)
			if st.State == 'Z' {
				what = fmt.Sprintf("process %d (%q) is a zombie its parent %d has not reaped", pid, st.Comm, st.PPID)
				if st.PPID == os.Getpid() {
					what += " (that is this program: it must wait for its child)"
				}
			}
			return time.Since(start), fmt.Errorf("criu: after %s %s", timeout, what)
		case <-tick.C:
		}
	}
}

// ErrPIDInUse is matched (errors.Is) by *PIDInUseError.
var ErrPIDInUse = errors.New("PID in use")

// PIDInUseError says a PID that a restore needs is taken.
type PIDInUseError struct {
	PID     int
	Owner   int    // the process holding it (== PID unless PID is a thread of Owner)
	Comm    string // Owner's command name
	Cmdline string // Owner's command line, space-separated
	Zombie  bool   // held by a zombie that was not reaped in time
}

func (e *PIDInUseError) Error() string {
	var who string
	switch {
	case e.Zombie:
		who = fmt.Sprintf("a zombie of %q that its parent has not reaped", e.Comm)
	case e.Owner != e.PID:
		who = fmt.Sprintf("a thread of process %d %q (cmdline %q)", e.Owner, e.Comm, e.Cmdline)
	default:
		who = fmt.Sprintf("%q (cmdline %q)", e.Comm, e.Cmdline)
	}
	return fmt.Sprintf("PID %d is in use by %s: restore needs the original PID; stop that process, or run the service under \"kcr run\" so it gets its own PID namespace", e.PID, who)
}

// Is makes errors.Is(err, ErrPIDInUse) true.
func (e *PIDInUseError) Is(target error) bool { return target == ErrPIDInUse }

// CheckPIDFree returns nil if pid is free for a restore. If a zombie holds
// it, it waits up to zombieWait for the zombie to be reaped; so it does for
// a task of a restore that CRIU is still aborting. If a live
// process (or a thread of one: thread IDs share the PID space) holds it, it
// returns a *PIDInUseError naming that process.
func CheckPIDFree(ctx context.Context, pid int, zombieWait time.Duration) error {
	st, err := readProcStat(pid)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("criu: process %d: %w", pid, err)
	}
	owner := tgid(pid)
	if restoring(owner) {
		// Left by a restore whose caller died: its CRIU aborts at its
		// next notification and kills the tree (see Restore).
		if _, err := WaitGone(ctx, owner, zombieWait); err == nil {
			return CheckPIDFree(ctx, pid, zombieWait)
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if st.State == 'Z' && owner == pid {
		if _, err := WaitGone(ctx, pid, zombieWait); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
		return &PIDInUseError{PID: pid, Owner: pid, Comm: st.Comm, Zombie: true}
	}
	e := &PIDInUseError{PID: pid, Owner: owner, Comm: st.Comm, Cmdline: cmdline(owner)}
	if owner != pid {
		if ost, err := readProcStat(owner); err == nil {
			e.Comm = ost.Comm
		}
	}
	return e
}

// restoring reports whether pid is a task that a CRIU restore forked and has
// not let go of yet: its parent is "criu swrk" or "criu restore".
func restoring(pid int) bool {
	st, err := readProcStat(pid)
	if err != nil || st.PPID <= 1 {
		return false
	}
	var isCRIU, isRestore bool
	for _, a := range strings.Fields(cmdline(st.PPID)) {
		switch {
		case filepath.Base(a) == "criu":
			isCRIU = true
		case isCRIU && (a == "swrk" || a == "restore"):
			isRestore = true
		}
	}
	return isRestore
}

// CheckImagePIDsFree checks, with CheckPIDFree, every PID and thread ID that
// restoring imagesDir will need. It returns the first conflict.
func CheckImagePIDsFree(ctx context.Context, imagesDir string, zombieWait time.Duration) error {
	tasks, err := ImageTasks(imagesDir)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		ids := append([]int{t.PID}, t.Threads...)
		for i, id := range ids {
			if i > 0 && id == t.PID {
				continue
			}
			if err := CheckPIDFree(ctx, id, zombieWait); err != nil {
				return err
			}
		}
	}
	return nil
}

// tgid returns the thread group (process) that task id belongs to, or id.
func tgid(id int) int {
	if st, err := procfs.ReadStatus(id); err == nil && st.Tgid > 0 {
		return st.Tgid
	}
	return id
}

func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// ProcessTree returns pid and all its descendants (pid first), from
// /proc/<pid>/task/*/children. Processes that exit meanwhile are left out.
func ProcessTree(pid int) []int { return procfs.Tree(pid) }

// StartTime returns the start time of process pid (field 22 of
// /proc/<pid>/stat, in clock ticks since boot): with the PID, it names one
// process, as a PID alone may be reused.
func StartTime(pid int) (uint64, error) { return procfs.StartTime(pid) }
