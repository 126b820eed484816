package notify_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
)

// Shutdown lets a running cycle finish: it returns only after kcr's
// follow-up came and the after-restore hooks ran, and then the socket is
// gone.
func TestShutdownWaitsForCycle(t *testing.T) {
	f := newFixture(t)
	if _, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.s.Shutdown(ctx(t)) }()
	// Give a Shutdown that does not wait the time to return.
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while the cycle waited for its follow-up", err)
	default:
	}
	if _, err := client.Resume(ctx(t), f.path, "dump failed", 5*time.Second); err != nil {
		t.Fatalf("follow-up during Shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if ev := <-f.afterEv; ev.Kind != notify.Resume || ev.Reason != "dump failed" {
		t.Errorf("after-restore event %+v, want kcr's resume", ev)
	}
	if _, err := os.Stat(f.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Shutdown: %v", err)
	}
}

// When ctx ends first, Shutdown closes anyway: the waiting cycle resumes
// and ctx's error is returned.
func TestShutdownDeadlineResumes(t *testing.T) {
	f := newFixture(t)
	if _, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.s.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the deadline", err)
	}
	select {
	case ev := <-f.afterEv:
		if ev.Kind != notify.Resume {
			t.Errorf("after-restore event %+v, want a resume", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cycle was left suspended after Shutdown")
	}
}

// An idle server shuts down at once.
func TestShutdownIdle(t *testing.T) {
	f := newFixture(t)
	if err := f.s.Shutdown(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{}); err == nil {
		t.Fatal("checkpoint after Shutdown succeeded")
	}
}
