package kgohooks

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/notify"
)

// A poll waiting on an empty topic when the checkpoint begins must neither
// fail nor return empty: it waits at the gate and then returns the records
// of the new client.
func TestWaitingPollSurvivesRestore(t *testing.T) {
	addrs, reg := newRig(t, 1, "w")
	c := newHooked(t, reg, groupOpts(addrs, "wg", "w"))
	ctx := testCtx(t, 15*time.Second)
	done := make(chan kgo.Fetches, 1)
	go func() { done <- c.PollFetches(ctx) }()
	for c.polls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let it wait inside kgo
	hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	select {
	case fs := <-done:
		t.Fatalf("poll returned during the cycle with %d records, errors %v", fs.NumRecords(), fs.Errors())
	case <-time.After(100 * time.Millisecond):
	}
	producePlain(t, addrs, "w", vals("x", 3))
	fs := <-done
	if errs := fs.Errors(); len(errs) > 0 {
		t.Fatalf("poll errors: %v", errs)
	}
	if fs.NumRecords() == 0 {
		t.Fatal("poll returned no records")
	}
	if v := string(fs.Records()[0].Value); v != "x-0" {
		t.Errorf("first record %q, want x-0", v)
	}
}
