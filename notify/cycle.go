package notify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kcr-dev/kcr/notify/proto"
)

// ErrBusy is returned when a checkpoint is requested while one is running.
var ErrBusy = proto.ErrBusy

// HookError is one resource's hook failure. The errors of a phase are joined
// with errors.Join, so errors.As finds each of them.
type HookError struct {
	Resource string // the name the resource was registered under
	Phase    Phase  // the hook that failed
	Err      error  // the hook's error
}

// Error names the resource, the phase and the hook's error.
func (e *HookError) Error() string {
	return fmt.Sprintf("resource %q %s: %v", e.Resource, e.Phase, e.Err)
}

// Unwrap returns Err.
func (e *HookError) Unwrap() error { return e.Err }

// Phase names a hook phase.
type Phase = proto.Phase

// Hook phases.
const (
	PhaseBeforeCheckpoint = proto.PhaseBeforeCheckpoint
	PhaseAfterRestore     = proto.PhaseAfterRestore
)

// Report describes one resource's hook run.
type Report = proto.HookReport

// hookGrace is how long a hook may overrun its context before it is reported
// as hung and left behind.
const hookGrace = 100 * time.Millisecond

// cycle is one checkpoint, from the first before-checkpoint hook to the last
// after-restore hook.
type cycle struct {
	g *Registry
	// done holds, in registration order, the resources whose before hook was
	// called; they are the ones that get an after hook.
	done []*entry
	// frozen is set once the before phase has ended; later registrations
	// join from the next cycle. Guarded by g.mu.
	frozen      bool
	lateJoiners []string
}

// begin starts a cycle, or fails with ErrBusy.
func (g *Registry) begin() (*cycle, error) {
	if !g.busy.TryLock() {
		return nil, ErrBusy
	}
	c := &cycle{g: g}
	g.mu.Lock()
	g.cycle = c
	g.mu.Unlock()
	return c, nil
}

// cycling reports whether a checkpoint cycle is running.
func (g *Registry) cycling() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cycle != nil
}

// end finishes the cycle and returns the names of resources that registered
// too late to take part.
func (c *cycle) end() []string {
	g := c.g
	g.mu.Lock()
	late := c.lateJoiners
	g.cycle = nil
	g.mu.Unlock()
	g.busy.Unlock()
	return late
}

// before runs BeforeCheckpoint in reverse registration order, then for any
// resource registered meanwhile, until none is left. It returns a report per
// resource (in call order) and the joined errors.
func (c *cycle) before(ctx context.Context) ([]Report, error) {
	g := c.g
	var reports []Report
	var errs []error
	seen := map[*entry]bool{}
	for round := 0; ; round++ {
		g.mu.Lock()
		var todo []*entry
		for _, e := range g.entries {
			if !seen[e] {
				todo = append(todo, e)
			}
		}
		// Newcomers join only while the phase's deadline holds: hooks that
		// keep registering resources must not stretch the phase without end.
		// Those left out are late joiners, like the ones after the phase.
		if len(todo) == 0 || (round > 0 && ctx.Err() != nil) {
			c.frozen = true
			for _, e := range todo {
				c.lateJoiners = append(c.lateJoiners, e.name)
			}
			g.mu.Unlock()
			break
		}
		g.mu.Unlock()
		slices.Reverse(todo)
		for _, e := range todo {
			seen[e] = true
			c.done = append(c.done, e)
			hctx, cc := withCarryCount(ctx)
			rep, err := runHook(hctx, e, PhaseBeforeCheckpoint, func(ctx context.Context) error {
				return e.res.BeforeCheckpoint(ctx)
			}, cc)
			reports = append(reports, rep)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Restore order is registration order.
	slices.SortFunc(c.done, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	return reports, errors.Join(errs...)
}

// after runs AfterRestore in registration order on every resource whose
// before hook ran, after updating the registry's identity for a Restore.
func (c *cycle) after(ctx context.Context, ev Event) (Event, []Report, error) {
	g := c.g
	g.mu.Lock()
	if ev.Kind == Restore {
		if ev.Generation == 0 {
			ev.Generation = g.generation + 1
		}
		g.generation = ev.Generation
		g.instanceID = newInstanceID()
	}
	ev.Generation = g.generation
	ev.InstanceID = g.instanceID
	g.mu.Unlock()

	var reports []Report
	var errs []error
	for _, e := range c.done {
		rep, err := runHook(ctx, e, PhaseAfterRestore, func(ctx context.Context) error {
			return e.res.AfterRestore(ctx, ev)
		}, nil)
		reports = append(reports, rep)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, e := range c.done {
		if ce, ok := e.res.(cycleEnder); ok {
			ce.AfterCycle()
		}
	}
	return ev, reports, errors.Join(errs...)
}

// cycleEnder is a resource told when every after-restore hook of a cycle
// has run (the handed-over listeners: their Accept waits until then).
type cycleEnder interface{ AfterCycle() }

// runHook calls fn with ctx, turns a panic into an error, and stops waiting
// for it shortly after ctx ends, so that one hung hook cannot hold the whole
// process suspended. A before-checkpoint hook passes its carry count (cc),
// which fills the report's carry fields and may turn into a veto.
func runHook(ctx context.Context, e *entry, phase Phase, fn func(context.Context) error, cc *carryCount) (Report, error) {
	start := time.Now()
	res := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				res <- fmt.Errorf("panic: %v", p)
			}
		}()
		res <- fn(ctx)
	}()
	var err error
	select {
	case err = <-res:
	case <-ctx.Done():
		t := time.NewTimer(hookGrace)
		select {
		case err = <-res:
		case <-t.C:
			err = fmt.Errorf("did not return within its deadline (%v): %w", context.Cause(ctx), context.DeadlineExceeded)
		}
		t.Stop()
	}
	rep := Report{Name: e.name, Phase: phase, Duration: time.Since(start)}
	if r, ok := e.res.(Reporter); ok {
		rep.Details = r.CheckpointReport()
	}
	if cc != nil {
		err = carried(ctx, cc, &rep, err)
	}
	if err != nil {
		herr := &HookError{Resource: e.name, Phase: phase, Err: err}
		rep.Error = herr.Error()
		return rep, herr
	}
	return rep, nil
}
