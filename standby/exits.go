package standby

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ExitPolicy is what kcr standby does when the service exits 0 by itself.
type ExitPolicy string

// The exit policies (docs/standby.md, "When the service exits").
const (
	// ExitRestart starts the service again cold, at once; the exit is not
	// counted as a failure.
	ExitRestart ExitPolicy = "restart"
	// ExitStop ends kcr standby with status 0: the service has finished.
	ExitStop ExitPolicy = "stop"
)

// Defaults of the exit handling.
const (
	DefaultOnExit = ExitRestart
	// DefaultCrashLimit failures in a row end kcr standby with an error.
	DefaultCrashLimit = 5
	// DefaultStableAfter is how long a run must last for the failures
	// before it to be forgotten.
	DefaultStableAfter = time.Minute
	// exitStatusWait bounds the wait for an exit status once the
	// service is seen gone.
	exitStatusWait = 2 * time.Second
)

// ErrCrashLoop is returned by Run when the service failed
// Options.CrashLimit times in a row.
var ErrCrashLoop = errors.New("crash loop")

// errExitedInRestore: the restored service exited before its restore was
// over (in its after-restore hooks).
var errExitedInRestore = errors.New("the restored service exited during its after-restore hooks")

func (p ExitPolicy) check() error {
	switch p {
	case ExitRestart, ExitStop:
		return nil
	}
	return fmt.Errorf("--on-exit %q: give restart or stop", string(p))
}

// checkLifecycle checks the shutdown and exit options and fills in their
// defaults.
func (o *Options) checkLifecycle() error {
	if o.OnTerm == "" {
		o.OnTerm = DefaultOnTerm
	}
	if o.TermGrace == 0 {
		o.TermGrace = DefaultTermGrace
	}
	if o.OnExit == "" {
		o.OnExit = DefaultOnExit
	}
	if o.CrashLimit == 0 {
		o.CrashLimit = DefaultCrashLimit
	}
	if o.StableAfter == 0 {
		o.StableAfter = DefaultStableAfter
	}
	if err := o.OnTerm.check(); err != nil {
		return err
	}
	return o.OnExit.check()
}

// exitInfo is how a copy of the service ended.
type exitInfo struct {
	Known  bool   // kcr reaped it (it was kcr's child): the fields below hold
	Code   int    // its exit status, if it exited
	Signal string // the signal that killed it ("" if it exited)
	OOM    bool   // SIGKILL while its memory cgroup counted an OOM kill
}

// clean is an exit with status 0.
func (e exitInfo) clean() bool { return e.Known && e.Signal == "" && e.Code == 0 }

// attrs are e's log attributes.
func (e exitInfo) attrs() []any {
	switch {
	case !e.Known:
		return []any{"exit", "unknown (not reaped by this kcr standby: adopted, or reaped elsewhere)"}
	case e.Signal != "":
		return []any{"exit", "signal " + e.Signal, "signal", e.Signal, "oom_killed", e.OOM}
	}
	return []any{"exit", "status " + strconv.Itoa(e.Code), "exit_code", e.Code}
}

// exitFromWait is the exitInfo of a wait status; oomBefore is the memory
// cgroup's OOM kill count when the process started (ok: it was read).
func exitFromWait(ws syscall.WaitStatus, oomBefore uint64, ok bool, oomNow func() (uint64, bool)) exitInfo {
	if ws.Signaled() {
		e := exitInfo{Known: true, Signal: unix.SignalName(ws.Signal())}
		if e.Signal == "" {
			e.Signal = strconv.Itoa(int(ws.Signal()))
		}
		if ws.Signal() == syscall.SIGKILL && ok {
			if n, ok := oomNow(); ok && n > oomBefore {
				e.OOM = true
			}
		}
		return e
	}
	return exitInfo{Known: true, Code: ws.ExitStatus()}
}

// exits reaps the copies of the service that are kcr standby's children
// and keeps how each ended, by PID.
type exits struct {
	mu sync.Mutex
	m  map[int]chan exitInfo
	// cgroup is the memory cgroup's OOM kill counter (oomKills).
	cgroup func(pid int) func() (uint64, bool)
}

func newExits() *exits {
	return &exits{m: map[int]chan exitInfo{}, cgroup: oomCounter}
}

func (x *exits) slot(pid int) chan exitInfo {
	x.mu.Lock()
	defer x.mu.Unlock()
	ch := make(chan exitInfo, 1)
	x.m[pid] = ch
	return ch
}

// started watches a cold start: kcr's child, reaped by package engine.
func (x *exits) started(pid int, ps <-chan *os.ProcessState) {
	ch, oom := x.slot(pid), x.cgroup(pid)
	before, ok := oom()
	go func() {
		if st := <-ps; st != nil {
			if ws, isWS := st.Sys().(syscall.WaitStatus); isWS {
				ch <- exitFromWait(ws, before, ok, oom)
				return
			}
		}
		ch <- exitInfo{}
	}()
}

// restored watches a restored copy: CRIU's child until CRIU exits, then
// kcr standby's (a child subreaper), or already its own as a container's
// PID 1. It is reaped here; a copy re-parented elsewhere is not.
func (x *exits) restored(p proc) {
	ch, oom := x.slot(p.PID), x.cgroup(p.PID)
	before, ok := oom()
	go func() {
		poll := 5 * time.Millisecond
		for {
			var ws syscall.WaitStatus
			_, err := syscall.Wait4(p.PID, &ws, 0, nil)
			switch {
			case err == nil:
				ch <- exitFromWait(ws, before, ok, oom)
				return
			case errors.Is(err, syscall.EINTR):
				continue
			case !alive(p):
				ch <- exitInfo{}
				return
			}
			// Not our child yet (CRIU has not exited), or never.
			time.Sleep(poll)
			poll = min(2*poll, time.Second)
		}
	}()
}

// status waits (exitStatusWait at most) for how pid ended.
func (x *exits) status(pid int) exitInfo {
	x.mu.Lock()
	ch, ok := x.m[pid]
	delete(x.m, pid)
	x.mu.Unlock()
	if !ok {
		return exitInfo{}
	}
	select {
	case e := <-ch:
		return e
	case <-time.After(exitStatusWait):
		return exitInfo{}
	}
}

// becomeSubreaper makes kcr standby the parent of the copies CRIU restores
// once CRIU exits, so that it reaps them and learns their exit status.
func (b *engineBackend) adoptCopies() {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		b.log.Warn("standby: not a child subreaper: the exit status of a restored service is unknown", "err", err)
	}
}

// oomCounter returns a reader of the OOM kill count of pid's memory
// cgroup (v2 memory.events, v1 memory.oom_control); ok is false where
// there is none.
func oomCounter(pid int) func() (uint64, bool) {
	var files []string
	if f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			files = append(files, cgroupOOMFiles(sc.Text())...)
		}
		f.Close()
	}
	return func() (uint64, bool) {
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				if n, ok := parseOOMKill(string(b)); ok {
					return n, true
				}
			}
		}
		return 0, false
	}
}

// cgroupOOMFiles are the files that count the OOM kills of the cgroup of
// one line of /proc/PID/cgroup.
func cgroupOOMFiles(line string) []string {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 {
		return nil
	}
	path := parts[2]
	switch {
	case parts[0] == "0" && parts[1] == "":
		return []string{"/sys/fs/cgroup" + path + "/memory.events", "/sys/fs/cgroup/unified" + path + "/memory.events"}
	case strings.Contains(","+parts[1]+",", ",memory,"):
		return []string{"/sys/fs/cgroup/memory" + path + "/memory.oom_control"}
	}
	return nil
}

// parseOOMKill reads the "oom_kill N" line of memory.events or
// memory.oom_control.
func parseOOMKill(s string) (uint64, bool) {
	for _, l := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// serviceExited handles the exit of c.p, seen gone while it ran (during
// "") or during its restore: it logs how it ended and picks the next step
// by Options.OnExit, counting a failure unless it exited 0 on its own. A
// run of Options.StableAfter or longer forgets the failures before it.
func (s *Supervisor) serviceExited(c *run, during string) {
	if s.replica != nil {
		s.replica.Gone("the service exited")
	}
	e := s.b.exitStatus(c.p)
	ran := time.Since(s.runSince())
	if c.crashes > 0 && ran >= s.o.StableAfter {
		c.crashes = 0
	}
	attrs := append([]any{"pid", c.p.PID, "ran_ms", ms(ran)}, e.attrs()...)
	if during == "" && e.clean() {
		if s.o.OnExit == ExitStop {
			s.log.Info("standby: the service exited 0; stopping (--on-exit stop)", attrs...)
			c.next = StateStopped
			return
		}
		s.log.Info("standby: the service exited 0; starting it again cold", attrs...)
		c.reason, c.next = "the service exited 0", StateStarting
		return
	}
	c.crashes++
	msg := "standby: the service exited by itself; restarting it cold"
	if during != "" {
		msg = "standby: the service exited " + during + "; restarting it cold"
	}
	s.log.Error(msg, append(attrs, "failures_in_a_row", c.crashes)...)
	c.reason, c.next = "the service exited", StateBackoff
}

// crashLoop reports whether the service failed Options.CrashLimit times
// in a row (none of its runs lasting Options.StableAfter), and then sets
// c.err: kcr standby exits non-zero, so that its own supervisor (systemd,
// the kubelet) sees the crash loop and can back off, alert or give up.
func (s *Supervisor) crashLoop(c *run) bool {
	if s.o.CrashLimit <= 0 || c.crashes < s.o.CrashLimit {
		return false
	}
	where := "its log " + s.o.Log
	if s.o.Log == LogStdio {
		where = "its output on kcr standby's stdout and stderr"
	}
	c.err = fmt.Errorf("%w: the service failed %d times in a row, no run lasting %v: see %s (--crash-limit)", ErrCrashLoop, c.crashes, s.o.StableAfter, where)
	s.log.Error("standby: crash loop; exiting non-zero", "failures_in_a_row", c.crashes, "stable_after_ms", ms(s.o.StableAfter))
	return true
}

// runSince is when the current copy of the service began to run.
func (s *Supervisor) runSince() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runStart
}

func (b *engineBackend) exitStatus(p proc) exitInfo { return b.exits.status(p.PID) }
