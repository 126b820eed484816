package kafkastandby

import (
	"context"
	"slices"
	"time"
)

// The hold among replicas (Config.Replicas): replicas that go idle
// together checkpoint at the same moment, and each sees the others in the
// group. Were they all to skip the hold, the group would be left empty,
// and the placeholder joining it then would start the broker's initial
// delay, which the first wake would pay. So while no record waits, each
// one's placeholder joins before its member leaves (the others are about
// to sleep too); once the service sleeps, one placeholder stays: the one
// with the lowest member id, once no real member is left.

// holdAmongReplicas bounds how long a replica's placeholder stays in a
// group whose real members run on (they got work and stay up): then it
// leaves them the group.
const holdAmongReplicas = holdSettle

// armAmongReplicas reports whether arm holds a group it would skip for
// skip: other replicas are in it, and no record waited at the last look,
// so they are likely to sleep with this one.
func (h *Hold) armAmongReplicas(skip string) bool {
	return skip == skipReplicas && h.groupIdle != nil && h.groupIdle()
}

// runAmongReplicas runs the hold of m (run) among replicas: m heartbeats
// fast, and follows real members' leaders, until it holds the group alone
// (elect); it leaves if another placeholder is elected, or if real
// members still run holdAmongReplicas after the service slept.
func (h *Hold) runAmongReplicas(ctx context.Context, m *holdMember, slept, woken <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	quiet := make(chan struct{})
	go func() {
		if !h.elect(ctx, slept) {
			cancel() // run's m leaves
			return
		}
		close(quiet)
	}()
	h.run(ctx, m, slept, quiet, woken)
}

// elect waits, once slept is closed, until this hold's placeholder is
// the only member of the group that stays: true once no real member is
// left and no other placeholder's member id is lower (the others leave),
// false when it should leave. Every replica applies the same rule to the
// same group, so one placeholder stays.
func (h *Hold) elect(ctx context.Context, slept <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-slept:
	}
	for deadline := time.Now().Add(holdAmongReplicas); ctx.Err() == nil; {
		g, err := h.describe(ctx)
		h.report()
		own := h.member()
		switch {
		case err != nil:
		case len(g.real) > 0:
			if time.Now().After(deadline) {
				h.result(HoldReleased, "reason", "other replicas keep the group")
				return false
			}
		case own != "" && g.has(own):
			if slices.ContainsFunc(g.placeholders, func(id string) bool { return id < own }) {
				h.result(HoldReleased, "reason", "another replica's placeholder holds the group")
				return false
			}
			return true
		case time.Now().After(deadline):
			// Not a member (yet): the hold's own rules decide.
			return true
		}
		if !sleepCtx(ctx, holdBeatArmed) {
			return false
		}
	}
	return false
}

// member is the placeholder's member id recorded in the state file ("":
// none).
func (h *Hold) member() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.saved.HoldMember
}
