package notify_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// carrier is a resource that declares n carried records in its hook and
// returns what Carrying returns (or nil, with ignore).
func carrier(rec *recorder, name string, n int64, ignore bool) notify.Resource {
	return notify.Func(func(ctx context.Context) error {
		rec.add("before:" + name)
		err := notify.Carrying(ctx, n)
		if ignore {
			return nil
		}
		return err
	}, func(ctx context.Context, ev notify.Event) error {
		rec.add("after:" + name + ":" + ev.Kind.String())
		return nil
	})
}

// Under RequireDrained a resource that carries records vetoes the dump;
// CRaC's rules hold: every resource is notified, all resume.
func TestCarryVeto(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		rec := newRecorder()
		g := notify.NewRegistry()
		g.Register("a", carrier(rec, "a", 0, false))
		g.Register("w", carrier(rec, "w", 7, ignore))
		g.Register("c", carrier(rec, "c", 0, false))
		r, err := g.Simulate(notify.WithRequireDrained(context.Background()), notify.SimRestore, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var ce *notify.CarryError
		if !errors.As(r.BeforeErr, &ce) || ce.Records != 7 {
			t.Fatalf("ignore=%v: before error %v, want a CarryError of 7 records", ignore, r.BeforeErr)
		}
		var he *notify.HookError
		if !errors.As(r.BeforeErr, &he) || he.Resource != "w" || !strings.Contains(he.Error(), `"w"`) || !strings.Contains(he.Error(), "7 records") {
			t.Errorf("ignore=%v: error %q does not name resource w and its 7 records", ignore, r.BeforeErr)
		}
		want := []string{"before:c", "before:w", "before:a", "after:a:resume", "after:w:resume", "after:c:resume"}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("ignore=%v: calls %v, want %v", ignore, got, want)
		}
		if r.Event.Kind != notify.Resume {
			t.Errorf("ignore=%v: event %v, want resume", ignore, r.Event.Kind)
		}
		for _, rep := range r.Before {
			if veto := rep.Name == "w"; rep.CarryVeto != veto || (veto && rep.Carried != 7) {
				t.Errorf("ignore=%v: report %+v: want veto and 7 carried only for w", ignore, rep)
			}
		}
	}
}

// Without RequireDrained carried records are reported, not vetoed.
func TestCarryReported(t *testing.T) {
	rec := newRecorder()
	g := notify.NewRegistry()
	g.Register("w", carrier(rec, "w", 7, false))
	g.Register("x", carrier(rec, "x", 0, false))
	r, err := g.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil || r.BeforeErr != nil {
		t.Fatalf("Simulate: %v, %v", err, r.BeforeErr)
	}
	if r.Event.Kind != notify.Restore {
		t.Errorf("event %v, want restore", r.Event.Kind)
	}
	for _, rep := range r.Before {
		want := map[string]int64{"w": 7}[rep.Name]
		if rep.Carried != want || rep.CarryVeto {
			t.Errorf("report %+v: want %d carried, no veto", rep, want)
		}
	}
}

// A resource that never carries returns a CarryError of its own, with or
// without RequireDrained; the report marks the veto.
func TestCarryErrorOfResource(t *testing.T) {
	g := notify.NewRegistry()
	own := errors.New("not flushed")
	g.Register("k", notify.Func(func(ctx context.Context) error {
		return &notify.CarryError{Records: 1, Err: own}
	}, nil))
	r, _ := g.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if !errors.Is(r.BeforeErr, own) || !strings.Contains(r.BeforeErr.Error(), "would carry 1 record into") {
		t.Fatalf("before error %v", r.BeforeErr)
	}
	if rep := r.Before[0]; !rep.CarryVeto || rep.Carried != 1 {
		t.Errorf("report %+v: want veto of 1", rep)
	}
}

// The flag travels over the control socket; the veto comes back as a
// failed checkpoint with the carry fields in its reports, and every
// resource resumed.
func TestCarryVetoOverSocket(t *testing.T) {
	f := newFixture(t)
	f.g.Register("w", carrier(f.rec, "w", 3, false))
	_, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: 2 * time.Second, RequireDrained: true})
	var hf *proto.HookFailure
	if !errors.As(err, &hf) {
		t.Fatalf("Checkpoint: %v, want a HookFailure", err)
	}
	var veto *proto.HookReport
	for i, r := range hf.Reports {
		if r.CarryVeto {
			veto = &hf.Reports[i]
		}
	}
	if veto == nil || veto.Name != "w" || veto.Carried != 3 {
		t.Fatalf("reports %+v: want a veto of 3 records by w", hf.Reports)
	}
	if ev := f.waitAfter(5 * time.Second); ev.Kind != notify.Resume {
		t.Errorf("probe got %v, want resume", ev.Kind)
	}
	f.waitIdle()
	calls := f.rec.take()
	for _, c := range []string{"before:w", "before:a", "before:b", "before:probe", "after:a", "after:b", "after:probe", "after:w:resume"} {
		if !slices.Contains(calls, c) {
			t.Errorf("calls %v: %s missing", calls, c)
		}
	}
	// Without the flag the same checkpoint goes ahead and reports them.
	m := f.checkpoint(client.CheckpointRequest{HookBudget: 2 * time.Second, ResumeAfter: 10 * time.Second})
	found := false
	for _, r := range m.Reports {
		found = found || (r.Name == "w" && r.Carried == 3 && !r.CarryVeto)
	}
	if !found {
		t.Errorf("ready reports %+v: want w carrying 3, no veto", m.Reports)
	}
	if _, err := client.Resume(ctx(t), f.path, "test over", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A failed checkpoint whose resume outlasts kcr's wait for the answer
// (budget + 5 s) is still answered "failed": a Writer vetoing because the
// broker is slow resends to that broker on resume. The resume goes on.
func TestFailedCheckpointAnsweredDuringSlowResume(t *testing.T) {
	f := newFixture(t)
	resumed := make(chan struct{})
	f.g.Register("slow", notify.Func(func(ctx context.Context) error {
		return notify.Carrying(ctx, 2)
	}, func(ctx context.Context, ev notify.Event) error {
		defer close(resumed)
		select {
		case <-time.After(6 * time.Second):
		case <-ctx.Done():
		}
		return nil
	}))
	start := time.Now()
	_, err := client.Checkpoint(context.Background(), f.path, client.CheckpointRequest{HookBudget: 200 * time.Millisecond, RequireDrained: true})
	var hf *proto.HookFailure
	if !errors.As(err, &hf) {
		t.Fatalf("Checkpoint after %v: %v, want the veto", time.Since(start), err)
	}
	select {
	case <-resumed:
		t.Fatal("the slow resume hook had finished before the answer")
	default:
	}
	<-resumed
	f.waitIdle()
}
