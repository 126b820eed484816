// Package hooktest holds test helpers for code that registers notify hooks.
package hooktest

import (
	"context"
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
