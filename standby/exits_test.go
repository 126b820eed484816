package standby

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Exit 0 restarts the service cold without counting a failure (and the
// log says so, at INFO); with ExitStop, Run returns nil. A crash is logged
// with its status or signal.
func TestExitPolicy(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.Idle = time.Hour })
	r.waitState(StateRunning)
	pid := r.s.Status().PID
	f.exit(pid, exitInfo{Known: true})
	waitFor(t, func() bool { p := r.s.Status().PID; return r.s.State() == StateRunning && p != pid && p != 0 }, r.log)
	log := r.log.String()
	if !strings.Contains(log, `"msg":"standby: the service exited 0; starting it again cold"`) || !strings.Contains(log, `"exit_code":0`) || strings.Contains(log, `"level":"ERROR"`) {
		t.Errorf("exit 0: want one INFO line with the status, no ERROR:\n%s", log)
	}
	if strings.Contains(log, `"to":"backoff"`) {
		t.Errorf("exit 0 waited in backoff:\n%s", log)
	}
	pid = r.s.Status().PID
	f.exit(pid, exitInfo{Known: true, Signal: "SIGKILL", OOM: true})
	r.waitState(StateBackoff)
	if log := r.log.String(); !strings.Contains(log, `"signal":"SIGKILL","oom_killed":true`) {
		t.Errorf("an OOM kill is not logged as one:\n%s", log)
	}

	f = newFake()
	r = startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.Idle, o.OnExit = time.Hour, ExitStop })
	r.waitState(StateRunning)
	f.exit(r.s.Status().PID, exitInfo{Known: true})
	r.waitState(StateStopped)
	if starts, _, _ := f.snapshot(); starts != 1 {
		t.Errorf("%d cold starts with --on-exit stop, want 1", starts)
	}
}

// CrashLimit failures in a row end Run with ErrCrashLoop; a run of
// StableAfter forgets the failures before it.
func TestCrashLoop(t *testing.T) {
	f := newFake()
	o := testOptions(filepath.Join(t.TempDir(), "img"))
	o.Idle, o.CrashLimit, o.StableAfter = time.Hour, 3, 300*time.Millisecond
	r := startRig(t, f, o.ImageDir, func(x *Options) { x.Idle, x.CrashLimit, x.StableAfter = o.Idle, o.CrashLimit, o.StableAfter })
	crash := func() {
		r.waitState(StateRunning)
		f.exit(r.s.Status().PID, exitInfo{Known: true, Code: 1})
		r.waitState(StateBackoff)
	}
	crash()
	crash()
	// A stable run: the two failures are forgotten.
	r.waitState(StateRunning)
	time.Sleep(400 * time.Millisecond)
	f.exit(r.s.Status().PID, exitInfo{Known: true, Code: 2})
	r.waitState(StateBackoff)
	if !strings.Contains(r.log.String(), `"exit_code":2,"failures_in_a_row":1`) {
		t.Fatalf("the failures before a stable run were not forgotten:\n%s", r.log.String())
	}
	crash()
	r.waitState(StateRunning)
	f.exit(r.s.Status().PID, exitInfo{Known: true, Signal: "SIGSEGV"})
	r.waitState(StateStopped)
	err := r.runErr()
	if !errors.Is(err, ErrCrashLoop) {
		t.Fatalf("Run returned %v, want ErrCrashLoop", err)
	}
}

// A restored copy that exits in its after-restore hooks is not logged as
// running: its exit is, as a failure.
func TestExitInRestoreHooks(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), nil)
	r.waitState(StateStandby)
	f.mu.Lock()
	f.exitInRestore = true
	f.mu.Unlock()
	r.s.Wake("test")
	r.waitState(StateBackoff)
	log := r.log.String()
	if !strings.Contains(log, "standby: the service exited during its after-restore hooks; restarting it cold") {
		t.Errorf("log lacks the exit in the hooks:\n%s", log)
	}
	if strings.Contains(log, `"msg":"standby: running","from":"restoring"`) {
		t.Errorf("the copy that exited was logged as running:\n%s", log)
	}
}

func TestOOMKillCount(t *testing.T) {
	if n, ok := parseOOMKill("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n"); !ok || n != 2 {
		t.Errorf("memory.events: %d %v", n, ok)
	}
	if n, ok := parseOOMKill("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"); !ok || n != 7 {
		t.Errorf("memory.oom_control: %d %v", n, ok)
	}
	if got := cgroupOOMFiles("0::/system.slice/x.service"); len(got) != 2 || got[0] != "/sys/fs/cgroup/system.slice/x.service/memory.events" {
		t.Errorf("v2: %v", got)
	}
	if got := cgroupOOMFiles("7:memory:/user.slice"); len(got) != 1 || got[0] != "/sys/fs/cgroup/memory/user.slice/memory.oom_control" {
		t.Errorf("v1: %v", got)
	}
	calls := 0
	oom := func() (uint64, bool) { calls++; return 3, true }
	var killed syscall.WaitStatus = syscall.WaitStatus(syscall.SIGKILL)
	if e := exitFromWait(killed, 2, true, oom); !e.OOM || e.Signal != "SIGKILL" {
		t.Errorf("SIGKILL with the count up: %+v", e)
	}
	if e := exitFromWait(killed, 3, true, oom); e.OOM {
		t.Errorf("SIGKILL with the count unchanged: %+v", e)
	}
	if e := exitFromWait(syscall.WaitStatus(3<<8), 0, true, oom); e.Code != 3 || e.Signal != "" || e.OOM {
		t.Errorf("exit 3: %+v", e)
	}
}

func waitFor(t *testing.T, cond func() bool, log *syncBuf) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met; log:\n%s", log.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
