package notify_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
)

// TestRestoreAfterSelfResume: the app resumed on its own (no follow-up
// within ResumeAfter) and only then did CRIU dump it, so the image is of an
// idle app. A copy restored from it must still find out that it is a new
// instance, with its before hooks run first.
func TestRestoreAfterSelfResume(t *testing.T) {
	st := newFakeStart()
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(10*time.Millisecond))
	_, id0 := f.g.Identity()
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 100 * time.Millisecond})
	if ev := f.waitAfter(3 * time.Second); ev.Kind != notify.Resume {
		t.Fatalf("self-resume event = %+v", ev)
	}
	f.waitIdle()
	f.rec.take()
	st.restore() // CRIU dumped the idle app; this is a copy
	ev := f.waitAfter(3 * time.Second)
	if ev.Kind != notify.Restore || !ev.SelfDetected || ev.InstanceID == id0 || ev.Generation != 1 || !strings.Contains(ev.Reason, "idle") {
		t.Errorf("event = %+v", ev)
	}
	if got, want := f.rec.take(), []string{"before:probe", "before:b", "before:a", "after:a", "after:b", "after:probe"}; !slices.Equal(got, want) {
		t.Errorf("calls after the restore = %v, want %v", got, want)
	}
	f.noAfter(300 * time.Millisecond) // one restore, one cycle
	f.waitIdle()
}

// TestRestoreDetectedOnceAfterCycle: a restore the waiting cycle handled is
// not taken for a second one by the idle watch.
func TestRestoreDetectedOnceAfterCycle(t *testing.T) {
	st := newFakeStart()
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(10*time.Millisecond))
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	st.restore()
	if _, err := client.Restored(ctx(t), f.path, 3, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ev := f.waitAfter(time.Second); ev.Kind != notify.Restore || ev.Generation != 3 {
		t.Errorf("event = %+v", ev)
	}
	f.noAfter(300 * time.Millisecond)
}

// TestRestoredMessageAfterSelfResume: kcr's after-restore message reaching a
// copy of an idle app (before its watch noticed) runs the cycle with kcr's
// generation instead of being refused.
func TestRestoredMessageAfterSelfResume(t *testing.T) {
	st := newFakeStart()
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(time.Hour))
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: time.Nanosecond})
	if ev := f.waitAfter(3 * time.Second); ev.Kind != notify.Resume {
		t.Fatalf("self-resume event = %+v", ev)
	}
	f.waitIdle()
	st.restore()
	done, err := client.Restored(ctx(t), f.path, 5, 5*time.Second)
	if err != nil {
		t.Fatalf("Restored to a copy of an idle app: %v", err)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Restore || ev.Generation != 5 || ev.SelfDetected || done.AppGeneration != 5 {
		t.Errorf("event = %+v, done = %+v", ev, done)
	}
	if _, err := client.Restored(ctx(t), f.path, 6, time.Second); err == nil {
		t.Error("a second Restored for the same restore was accepted")
	}
}
