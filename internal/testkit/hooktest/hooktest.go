// Package hooktest holds test helpers for code that registers notify hooks.
package hooktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// SimulateOK runs a checkpoint cycle of outcome on reg and fails the test
// unless it ran and both phases succeeded.
func SimulateOK(t testing.TB, ctx context.Context, reg *notify.Registry, outcome notify.SimOutcome, budget time.Duration) notify.SimResult {
	t.Helper()
	res, err := reg.Simulate(ctx, outcome, budget)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("cycle: %v, before %v, after %v", err, res.BeforeErr, res.AfterErr)
	}
	return res
}

// SimulateRefused runs a restore cycle on reg that a before hook must
// refuse with an error that is want (errors.Is), and fails the test unless
// it did and the process then resumed cleanly.
func SimulateRefused(t testing.TB, ctx context.Context, reg *notify.Registry, budget time.Duration, want error) notify.SimResult {
	t.Helper()
	res, err := reg.Simulate(ctx, notify.SimRestore, budget)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.BeforeErr, want) {
		t.Fatalf("before error = %v, want %v", res.BeforeErr, want)
	}
	if res.Event.Kind != notify.Resume || res.AfterErr != nil {
		t.Fatalf("event %v, after error %v; want a clean resume", res.Event.Kind, res.AfterErr)
	}
	return res
}
