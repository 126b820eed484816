package standby

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stateFile reads the state file's state.
func stateFile(t *testing.T, dir string) State {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		State State `json:"state"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return p.State
}

// The default policy: a running service is checkpointed when Run's
// context ends, and the next supervisor on the directory waits for a wake
// and restores it, without a cold start.
func TestShutdownCheckpoints(t *testing.T) {
	f := newFake()
	dir := filepath.Join(t.TempDir(), "img")
	long := func(o *Options) { o.Idle = time.Hour }
	r := startRig(t, f, dir, long)
	r.waitState(StateRunning)
	pid := r.s.Status().PID
	r.end()
	if f.alive(proc{PID: pid, Start: uint64(pid)}) {
		t.Fatal("the service runs on after the shutdown")
	}
	if _, _, ckpts := f.snapshot(); len(ckpts) != 1 {
		t.Fatalf("checkpoints %v, want one at shutdown", ckpts)
	}
	if st := stateFile(t, dir); st != StateStandby {
		t.Fatalf("state file says %q after the shutdown, want standby", st)
	}
	if !strings.Contains(r.log.String(), "standby: shutdown: the service is checkpointed") {
		t.Errorf("log lacks the shutdown's checkpoint:\n%s", r.log.String())
	}
	r2 := startRig(t, f, dir, long)
	r2.waitState(StateStandby)
	r2.s.Wake("test")
	r2.waitState(StateRunning)
	if starts, restores, _ := f.snapshot(); starts != 1 || len(restores) != 1 {
		t.Fatalf("%d cold starts and restores %v, want 1 and the shutdown's image", starts, restores)
	}
}

// A checkpoint refused (its hooks veto it), or slower than its share of
// the grace period, falls back to stopping the service; the next start is
// cold.
func TestShutdownFallsBackToStop(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(f *fake)
	}{
		{"refused", func(f *fake) { f.refuse = 1 << 20 }},
		{"too slow", func(f *fake) { f.ckptDelay = time.Minute }},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			c.mod(f)
			dir := filepath.Join(t.TempDir(), "img")
			r := startRig(t, f, dir, func(o *Options) { o.Idle = time.Hour; o.TermGrace = 600 * time.Millisecond })
			r.waitState(StateRunning)
			t0 := time.Now()
			r.end()
			if d := time.Since(t0); d > 5*time.Second {
				t.Errorf("the shutdown took %v with a grace of 600ms", d)
			}
			if f.stops != 1 || len(f.copies()) != 0 {
				t.Fatalf("%d stops, %d copies left, want the service stopped", f.stops, len(f.copies()))
			}
			if st := stateFile(t, dir); st != StateStarting {
				t.Fatalf("state file says %q, want starting (a cold start next)", st)
			}
			if !strings.Contains(r.log.String(), "stopping the service instead") {
				t.Errorf("log lacks the fallback:\n%s", r.log.String())
			}
		})
	}
}

// --on-term stop stops the service, killing it at the end of the grace
// period if it ignores SIGTERM; --on-term leave leaves it running.
func TestShutdownStopAndLeave(t *testing.T) {
	f := newFake()
	f.stopHangs = true
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.Idle, o.OnTerm, o.TermGrace = time.Hour, TermStop, 300*time.Millisecond
	})
	r.waitState(StateRunning)
	r.end()
	if _, _, ckpts := f.snapshot(); f.stops != 1 || len(f.copies()) != 0 || len(ckpts) != 0 {
		t.Fatalf("%d stops, %d copies, checkpoints %v: want one stop, nothing left, no checkpoint", f.stops, len(f.copies()), ckpts)
	}
	if !strings.Contains(r.log.String(), `"killed":true`) {
		t.Errorf("log does not say the service was killed:\n%s", r.log.String())
	}

	f = newFake()
	r = startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.Idle, o.OnTerm = time.Hour, TermLeave })
	r.waitState(StateRunning)
	r.end()
	if _, _, ckpts := f.snapshot(); f.stops != 0 || len(f.copies()) != 1 || len(ckpts) != 0 {
		t.Fatalf("%d stops, %d copies, checkpoints %v: want the service left running", f.stops, len(f.copies()), ckpts)
	}
}

func TestTermPolicyCheck(t *testing.T) {
	o := testOptions(t.TempDir())
	o.OnTerm = "pause"
	if err := o.check(); err == nil || !strings.Contains(err.Error(), "give checkpoint, stop or leave") {
		t.Fatalf("--on-term pause: %v", err)
	}
	o = testOptions(t.TempDir())
	if err := o.check(); err != nil || o.OnTerm != TermCheckpoint || o.TermGrace != DefaultTermGrace {
		t.Fatalf("defaults: %v %q %v", err, o.OnTerm, o.TermGrace)
	}
}
