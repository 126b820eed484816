package notify_test

import (
	"context"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
)

// Activity counts touches, sums open gauges while they are registered, and
// shows a checkpoint cycle's hooks as in flight only while they run.
func TestActivity(t *testing.T) {
	g := notify.NewRegistry()
	if a := g.Activity(); a != (notify.Activity{}) {
		t.Fatalf("fresh registry: %+v, want zero", a)
	}
	g.Touch(3)
	g.Touch(0)
	g.Touch(-2) // ignored: the count only grows
	open := 2
	remove := g.AddOpenGauge(func() int { return open })
	g.AddOpenGauge(func() int { return -1 }) // a gauge below 0 counts as 0
	if a := g.Activity(); a.Count != 3 || a.OpenConns != 2 || a.HooksInFlight {
		t.Fatalf("after Touch(3) and a gauge of 2: %+v", a)
	}
	remove()
	if a := g.Activity(); a.OpenConns != 0 {
		t.Fatalf("gauge removed: OpenConns %d, want 0", a.OpenConns)
	}

	inside, release := make(chan notify.Activity), make(chan struct{})
	g.Register("probe", notify.Func(func(context.Context) error {
		inside <- g.Activity()
		<-release
		return nil
	}, nil))
	done := make(chan error, 1)
	go func() {
		_, err := g.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
		done <- err
	}()
	if a := <-inside; !a.HooksInFlight {
		t.Errorf("during the before-checkpoint hook: HooksInFlight false")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a := g.Activity(); a.HooksInFlight {
		t.Errorf("after the cycle: HooksInFlight true")
	}
}

// The package-level Touch counts on notify.Default.
func TestTouchDefault(t *testing.T) {
	before := notify.Default.Activity().Count
	notify.Touch()
	notify.Touch()
	if got := notify.Default.Activity().Count - before; got != 2 {
		t.Fatalf("two Touch calls added %d", got)
	}
}

// kcr reads the activity over the control socket.
func TestActivityOverSocket(t *testing.T) {
	f := newFixture(t)
	f.g.Touch(5)
	f.g.AddOpenGauge(func() int { return 1 })
	m, err := client.Activity(ctx(t), f.path)
	if err != nil {
		t.Fatal(err)
	}
	if m.Activity != 5 || m.OpenConns != 1 || m.HooksInFlight {
		t.Fatalf("activity %d, open %d, in flight %v; want 5, 1, false", m.Activity, m.OpenConns, m.HooksInFlight)
	}
	f.g.Touch(1)
	if m, err = client.Activity(ctx(t), f.path); err != nil || m.Activity != 6 {
		t.Fatalf("after one more touch: %d, %v; want 6", m.Activity, err)
	}
}
