package standby

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// TestWakePhases: a wake's breakdown shows in the status, the state file
// and the metrics, with its first-activity phase: the restored service did
// something (a record handed to it) even before the supervisor first
// asked.
func TestWakePhases(t *testing.T) {
	f := newFake()
	f.touchOnRestore = true
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.Idle = time.Hour // awake until the test is done with it
		o.Observer = m
	})
	r.waitState(StateRunning)
	if st := r.s.Status(); st.LastWake != nil {
		t.Fatalf("before any wake: last wake %+v", st.LastWake)
	}
	if !r.s.Sleep() {
		t.Fatal("Sleep of a running service returned false")
	}
	r.waitState(StateStandby)
	before := time.Now()
	if !r.s.Wake("manual") {
		t.Fatal("Wake of a checkpointed service returned false")
	}
	r.waitState(StateRunning)
	w := r.s.Status().LastWake
	if w == nil || w.Source != "manual" || w.At.Before(before.Add(-time.Second)) || w.HooksDoneMS <= 0 || w.RestoredMS > w.HooksDoneMS {
		t.Fatalf("last wake %+v: want a manual wake, restored before its hooks were done", w)
	}
	wait.For(t, 10*time.Second, "the first activity in the wake's phases", func() bool {
		w := r.s.Status().LastWake
		return w != nil && w.FirstActivityMS >= w.HooksDoneMS
	})
	wait.For(t, 10*time.Second, "the first activity in the state file", func() bool {
		st, err := r.s.dir.readState()
		return err == nil && st.LastWake != nil && st.LastWake.FirstActivityMS > 0
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	for _, mf := range mfs {
		if mf.GetName() != "kcr_standby_wake_phase_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			if s.GetHistogram().GetSampleCount() == 1 {
				phases = append(phases, s.GetLabel()[0].GetValue())
			}
		}
	}
	if got := strings.Join(phases, ","); got != "first_activity,hooks_done,restored" {
		t.Errorf("wake phase metrics with one sample: %q, want first_activity,hooks_done,restored", got)
	}
}
