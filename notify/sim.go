package notify

import (
	"context"
	"time"
)

// SimOutcome selects how a simulated checkpoint ends.
type SimOutcome int

const (
	// SimRestore ends the cycle as if the process were restored from an
	// image: after-restore hooks see Restore and a new identity.
	SimRestore SimOutcome = iota
	// SimResume ends it as if the dump had failed or --leave-running was
	// used: after-restore hooks see Resume.
	SimResume
	// SimLeaveRunning is a checkpoint with --leave-running: before hooks
	// see LeaveRunning(ctx), after-restore hooks see Resume.
	SimLeaveRunning
	// SimLeaveRunningCopy is what a copy restored from a --leave-running
	// image sees: before hooks saw LeaveRunning(ctx), after-restore hooks
	// see Restore.
	SimLeaveRunningCopy
)

// SimResult is what a simulated cycle did.
type SimResult struct {
	Before []Report // in call order
	After  []Report // in call order
	Event  Event    // what the after-restore hooks received
	// BeforeErr and AfterErr are the joined hook errors of each phase.
	BeforeErr, AfterErr error
	// LateJoiners names the resources registered after the before phase had
	// ended; they were not part of this cycle and join from the next one.
	LateJoiners []string
}

// Simulate runs a full checkpoint cycle on the registry in-process, without
// CRIU or privileges, for the service's own unit tests: before-checkpoint
// hooks (reverse order), then, as in a real checkpoint, after-restore hooks
// with Restore if every before hook succeeded, or with Resume if one failed.
// budget bounds each phase (0 means 10 s). It returns ErrBusy if a checkpoint
// is already running on the registry.
func (g *Registry) Simulate(ctx context.Context, outcome SimOutcome, budget time.Duration) (SimResult, error) {
	if budget <= 0 {
		budget = DefaultHookBudget
	}
	c, err := g.begin()
	if err != nil {
		return SimResult{}, err
	}
	ended := false
	defer func() {
		if !ended {
			c.end()
		}
	}()

	var r SimResult
	leave := outcome == SimLeaveRunning || outcome == SimLeaveRunningCopy
	bctx, cancel := context.WithTimeout(withLeaveRunning(ctx, leave), budget)
	r.Before, r.BeforeErr = c.before(bctx)
	cancel()

	ev := Event{Kind: Restore, Reason: "restored (simulated)"}
	if r.BeforeErr != nil {
		ev = Event{Kind: Resume, Reason: "checkpoint failed (simulated): " + r.BeforeErr.Error()}
	} else if outcome == SimResume {
		ev = Event{Kind: Resume, Reason: "resumed (simulated)"}
	} else if outcome == SimLeaveRunning {
		ev = Event{Kind: Resume, Reason: "leave-running (simulated)"}
	}
	actx, cancel := context.WithTimeout(ctx, budget)
	r.Event, r.After, r.AfterErr = c.after(actx, ev)
	cancel()
	ended = true
	r.LateJoiners = c.end()
	return r, nil
}
