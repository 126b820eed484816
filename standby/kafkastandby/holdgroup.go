package kafkastandby

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kcr-dev/kcr/standby/kafkawake"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Hold keeps the service's classic consumer group from ever being
// empty while the service sleeps, so that a wake does not wait out the
// broker's group.initial.rebalance.delay.ms: a placeholder member joins
// before the checkpoint and is removed once the restored member's join has
// started a rebalance. Why it works this way, step by step: docs/standby.md,
// "The group hold". It never creates a group, nor joins a KIP-848 or an
// empty one (that join would start the very delay it avoids).
type Hold struct {
	o    *Config
	log  *slog.Logger
	cl   *kgo.Client
	adm  *kadm.Client
	save func(member, protocol string) error // records the hold in the state file (Config.SaveHold)
	reqs atomic.Int64                        // requests written, for Observer.BrokerRequests

	mu     sync.Mutex
	saved  holdSaved
	cancel context.CancelFunc // of the running hold; nil when none runs
	done   chan struct{}      // closed when it returned
	slept  chan struct{}      // closed by asleep
	woken  chan struct{}      // closed by wake
	// others: the last arm was skipped because other replicas were in the
	// group (Config.Replicas); asleep then holds the group if they all
	// left with this replica.
	others bool
	// groupIdle (Config.Replicas) reports that no record waited in the
	// group at the last look before the checkpoint: the other replicas
	// are idle too, and likely to sleep with this one.
	groupIdle func() bool
}

// skipReplicas is why arm skips a group that other replicas keep.
const skipReplicas = "other replicas keep the group"

// holdSaved is what the hold keeps in the state file (Config.SaveHold):
// its placeholder's member id while it may be in the group, and the
// protocol it offers, the service's (standby's holdSaved says why).
type holdSaved struct {
	HoldMember   string
	HoldProtocol string
}

// The placeholder's timing.
const (
	// holdSession outlasts a broker restart: the placeholder stays a
	// member while its coordinator moves or reloads.
	holdSession = 30 * time.Second
	// holdPendingSession is the first join's: how long the broker keeps
	// the pending member that join creates (memberID).
	holdPendingSession = 6 * time.Second
	holdRebalance      = 10 * time.Second
	// holdEmptyRebalance is the rebalance timeout of a join into an empty
	// group. The broker extends the initial delay for members that join
	// inside it only while the first member's rebalance timeout exceeds
	// the delay (3 s by default); at 3 s, neither a second placeholder nor
	// the restored member extends it. It outlasts holdBeatAsleep: until
	// the next join, it bounds the placeholder's rejoin of a rebalance.
	holdEmptyRebalance = 3 * time.Second
	// Heartbeats while the service checkpoints (the placeholder rejoins
	// as soon as the service's member left) and while it sleeps.
	holdBeatArmed  = 200 * time.Millisecond
	holdBeatAsleep = 2 * time.Second
	holdRetry      = time.Second
	// Armed: how long the checkpoint waits for the placeholder to be a
	// member.
	holdArmBound = 3 * time.Second
	// Armed: how long the checkpoint waits for a rebalancing group to
	// settle (the service's first join waits out the initial delay).
	holdSettle = 10 * time.Second
	// Woken: how often the group is looked at until the restored member
	// joined (fast for holdWakeFast, then slower), and for how long.
	holdWakePoll    = 5 * time.Millisecond
	holdWakeFast    = 3 * time.Second
	holdWakeSlow    = 100 * time.Millisecond
	holdWakeBound   = 30 * time.Second
	holdLeaveBudget = 5 * time.Second
	// holdLeaveRetry spaces the tries of a leave that failed.
	holdLeaveRetry = 500 * time.Millisecond
	holdClientID   = "kcr-standby-hold"
	holdReason     = "kcr standby holds the group while the service sleeps"
)

// Results of a hold, for Observer.GroupHold.
const (
	HoldHeld     = "held"     // the placeholder is in the group
	HoldSkipped  = "skipped"  // nothing to hold: a KIP-848 group, no group, an empty one
	HoldReleased = "released" // the placeholder left: the service (or another member) joined
	HoldFailed   = "failed"   // a request failed; the group may be empty
)

func newHold(o *Config) (*Hold, error) {
	h := &Hold{o: o, log: o.Logger, save: o.SaveHold}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(o.Brokers...), kgo.ClientID(holdClientID),
		kgo.WithHooks(kafkawake.RequestCounter{N: &h.reqs})}, o.kafkaOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrBadOption, o.Brokers, err)
	}
	h.cl, h.adm = cl, kadm.NewClient(cl)
	return h, nil
}

// Close stops a running hold (the placeholder leaves) and the client.
func (h *Hold) Close() {
	h.Stop()
	h.cl.Close()
}

// Load takes what an earlier kcr standby recorded.
func (h *Hold) Load(member, protocol string) {
	h.mu.Lock()
	h.saved = holdSaved{HoldMember: member, HoldProtocol: protocol}
	h.mu.Unlock()
}

// setMember and setProtocol record the hold in the state file; the
// error says the record failed (a full disk).
func (h *Hold) setMember(id string) error {
	h.mu.Lock()
	h.saved.HoldMember = id
	s := h.saved
	h.mu.Unlock()
	return h.save(s.HoldMember, s.HoldProtocol)
}

func (h *Hold) setProtocol(p string) {
	h.mu.Lock()
	h.saved.HoldProtocol = p
	s := h.saved
	h.mu.Unlock()
	h.save(s.HoldMember, s.HoldProtocol)
}

func (h *Hold) protocol() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.saved.HoldProtocol
}

// Arm puts a placeholder in the group before the checkpoint, while the
// service's member is in it, and returns once the broker lists it (or the
// hold is skipped): the service's member may leave then. ctx bounds the
// whole hold.
func (h *Hold) Arm(ctx context.Context) {
	if h.o.NoHoldGroup {
		return
	}
	h.Stop()
	defer h.report()
	proto, skip, err := h.serviceProtocol(ctx)
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		h.result(HoldFailed, "err", err)
		return
	case skip != "" && !h.armAmongReplicas(skip):
		if skip == skipReplicas && proto != "" && proto != h.protocol() {
			h.setProtocol(proto)
		}
		h.mu.Lock()
		h.others = skip == skipReplicas
		h.mu.Unlock()
		h.result(HoldSkipped, "reason", skip)
		return
	}
	h.mu.Lock()
	h.others = false
	h.mu.Unlock()
	if proto != h.protocol() {
		h.setProtocol(proto)
	}
	// Among replicas, whether or not the others were in the group when
	// it looked (they may have left while it waited for a rebalance to
	// settle), one placeholder stays.
	among := h.o.Replicas
	m := &holdMember{}
	if err := h.memberID(ctx, m); err != nil {
		h.result(HoldFailed, "err", err)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done, slept, woken := make(chan struct{}), make(chan struct{}), make(chan struct{})
	h.mu.Lock()
	h.cancel, h.done, h.slept, h.woken = cancel, done, slept, woken
	h.mu.Unlock()
	go func() {
		defer close(done)
		defer h.report()
		if among {
			h.runAmongReplicas(ctx, m, slept, woken)
			return
		}
		h.run(ctx, m, slept, slept, woken)
	}()
	h.waitListed(ctx, m.id, done)
}

// waitListed waits until the broker lists member in the group (its join
// made it a member), the hold ended, or holdArmBound passed.
func (h *Hold) waitListed(ctx context.Context, member string, done <-chan struct{}) {
	bound := time.After(holdArmBound)
	for {
		g, err := h.describe(ctx)
		if err == nil && g.has(member) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-bound:
			h.log.Warn("standby: group hold: the placeholder is not listed in the group yet; checkpointing anyway", "group", h.o.Group, "member_id", member)
			return
		case <-time.After(holdWakePoll):
		}
	}
}

// Asleep tells the running hold that the checkpoint is done: the
// service's member left. If arm skipped the group for other replicas,
// and they left too (they slept at the same moment), a placeholder joins
// the group, empty now: later wakes do not pay the initial delay.
func (h *Hold) Asleep(ctx context.Context) {
	h.closeOnce(func() *chan struct{} { return &h.slept })
	h.mu.Lock()
	others := h.others
	h.others = false
	h.mu.Unlock()
	if !others || h.protocol() == "" {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done, slept, woken := make(chan struct{}), make(chan struct{}), make(chan struct{})
	close(slept)
	h.mu.Lock()
	h.cancel, h.done, h.woken = cancel, done, woken
	h.mu.Unlock()
	go func() {
		defer close(done)
		defer h.report()
		// The others' leaves settle first: a group still rebalancing may
		// lose its last members yet.
		h.settled(ctx)
		// With no member left, canRejoin joins the empty group; another
		// replica's placeholder may join it at the same moment.
		h.runAmongReplicas(ctx, &holdMember{}, slept, woken)
	}()
}

// settled waits, up to holdSettle, until the group is not rebalancing.
func (h *Hold) settled(ctx context.Context) {
	for deadline := time.Now().Add(holdSettle); time.Now().Before(deadline); {
		g, err := h.describe(ctx)
		if err == nil && g.state != "PreparingRebalance" && g.state != "CompletingRebalance" {
			return
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return
		}
	}
}

// Woken tells the running hold that the service is being restored: the
// placeholders leave once the restored member's join started a rebalance.
func (h *Hold) Woken() { h.closeOnce(func() *chan struct{} { return &h.woken }) }

func (h *Hold) closeOnce(ch func() *chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := ch(); *c != nil {
		close(*c)
		*c = nil
	}
}

// ReleaseOthers removes, the service woken without a hold of its own,
// the placeholders in the group once a member is in it: other replicas'
// (they would rejoin every rebalance of the live members), and those a
// restarted broker brought back. A coordinator that reloads a group whose
// rebalance its stop cut short restores the members of the last completed
// generation, placeholders that had left included; such a placeholder
// never heartbeats again, and held up the restored member's join for its
// whole session (30 s from the reload).
func (h *Hold) ReleaseOthers(ctx context.Context) {
	if h.o.NoHoldGroup && !h.o.Replicas {
		return
	}
	h.mu.Lock()
	running := h.done != nil && !isClosed(h.done)
	h.mu.Unlock()
	if !running {
		h.release(ctx, "")
	}
}

// Stop stops the running hold and waits until the placeholder left.
func (h *Hold) Stop() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.cancel, h.done, h.slept, h.woken = nil, nil, nil, nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// run keeps m in the group until the wake (then releases the group) or
// until ctx ends (then m leaves). slept and quiet: hold.
func (h *Hold) run(ctx context.Context, m *holdMember, slept, quiet, woken <-chan struct{}) {
	mctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-woken:
			cancel()
		case <-mctx.Done():
		}
	}()
	h.hold(mctx, m, slept, quiet)
	cancel()
	select {
	case <-woken:
		h.release(ctx, m.id)
		return
	default:
	}
	if m.id != "" {
		h.leave(m.id)
	}
}

// release waits, the service woken, until a member other than the
// placeholders is in the group (the restored one joined), and then
// removes every placeholder: the rebalance the join started completes
// without them. own is the placeholder of this hold ("": none).
func (h *Hold) release(ctx context.Context, own string) {
	start := time.Now()
	for {
		g, err := h.describe(ctx)
		h.report()
		switch {
		case ctx.Err() != nil:
			if own != "" {
				h.leave(own)
			}
			return
		case err != nil:
		case len(g.placeholders) == 0:
			// Nothing to release (another kcr standby did, or none held).
			h.setMember("")
			return
		case len(g.real) > 0:
			err := h.leaveGroup(g.placeholders...)
			if err == nil {
				h.setMember("")
				h.result(HoldReleased, "reason", "a member joined", "woken", true, "placeholders", len(g.placeholders), "after_ms", ms(time.Since(start)))
				return
			}
			h.log.Warn("standby: group hold: removing the placeholders failed; trying again", "group", h.o.Group, "err", err)
		}
		if time.Since(start) > holdWakeBound {
			if own != "" {
				h.leave(own)
			}
			h.result(HoldReleased, "reason", "no member joined within "+holdWakeBound.String()+" of the wake")
			return
		}
		every := holdWakePoll
		if time.Since(start) > holdWakeFast {
			every = holdWakeSlow
		}
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
}

// report passes the requests written since the last report on.
func (h *Hold) report() {
	if n := h.reqs.Swap(0); n > 0 {
		h.o.Observer.BrokerRequests(int(n))
	}
}

func (h *Hold) result(r string, attrs ...any) {
	h.o.Observer.GroupHold(r)
	lvl := slog.LevelInfo
	if r == HoldFailed {
		lvl = slog.LevelWarn
	}
	h.log.Log(context.Background(), lvl, "standby: group hold "+r, append([]any{"group", h.o.Group}, attrs...)...)
}

// holdGroup is the group as the hold sees it.
type holdGroup struct {
	kip848       bool
	exists       bool   // false: no group, or a dead one
	state        string // the classic group's state
	protocolType string
	protocol     string
	placeholders []string // member ids of kcr standby placeholders
	real         []string // member ids of the others
}

func (g holdGroup) has(member string) bool {
	for _, id := range g.placeholders {
		if id == member {
			return true
		}
	}
	return false
}

// describe describes the group.
func (h *Hold) describe(ctx context.Context) (holdGroup, error) {
	rctx, cancel := context.WithTimeout(ctx, holdLeaveBudget)
	defer cancel()
	var g holdGroup
	ds, err := h.adm.DescribeGroups(rctx, h.o.Group)
	if err != nil {
		return g, fmt.Errorf("describe group %q: %w", h.o.Group, err)
	}
	d := ds[h.o.Group]
	switch {
	case errors.Is(d.Err, kerr.GroupIDNotFound):
		return g, nil
	case d.Err != nil:
		return g, fmt.Errorf("describe group %q: %w", h.o.Group, d.Err)
	}
	g.exists = d.State != "Dead" && d.State != ""
	g.state, g.protocolType, g.protocol = d.State, d.ProtocolType, d.Protocol
	for _, m := range d.Members {
		if isPlaceholder(m.ClientID, m.MemberID) {
			g.placeholders = append(g.placeholders, m.MemberID)
		} else {
			g.real = append(g.real, m.MemberID)
		}
	}
	return g, nil
}

// isPlaceholder tells a placeholder by its client id, or (where the
// client id is not known: in a JoinGroup response) by its member id, which
// a broker makes from the client id.
func isPlaceholder(clientID, memberID string) bool {
	return clientID == holdClientID || strings.HasPrefix(memberID, holdClientID+"-")
}

// serviceProtocol describes the group before the checkpoint: the
// protocol its members use, or why not to hold it at all.
func (h *Hold) serviceProtocol(ctx context.Context) (proto, skip string, err error) {
	kip848, err := h.isKIP848(ctx)
	if err != nil {
		return "", "", err
	}
	if kip848 {
		return "", "a KIP-848 group (no initial rebalance delay)", nil
	}
	for deadline := time.Now().Add(holdSettle); time.Now().Before(deadline); {
		g, err := h.describe(ctx)
		switch {
		case err != nil:
			return "", "", err
		case !g.exists:
			// Joining would create it.
			return "", "no group: the service is not in one", nil
		case g.protocolType != "consumer":
			return "", fmt.Sprintf("protocol type %q is not that of a consumer group", g.protocolType), nil
		case g.state == "Empty" || len(g.real) == 0:
			// Joining an empty group starts the initial delay.
			return "", "the group is empty: the service is not in it", nil
		case h.o.Replicas && len(g.real) > 1 && g.protocol != "":
			// Only a group that would be left empty is held.
			return g.protocol, skipReplicas, nil
		case g.protocol != "":
			return g.protocol, "", nil
		}
		// Rebalancing (the service's first join waits out the initial
		// delay, say): the protocol is chosen when it completes.
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if p := h.protocol(); p != "" {
		return p, "", nil
	}
	return "", "the group's protocol is not known: it is rebalancing", nil
}

// isKIP848 reports whether the group is a KIP-848 ("consumer" type) group.
// A broker without KIP-848 ignores the type filter and leaves the type
// empty.
func (h *Hold) isKIP848(ctx context.Context) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, holdLeaveBudget)
	defer cancel()
	lg, err := h.adm.ListGroupsByType(rctx, []string{"consumer"})
	if err != nil {
		return false, fmt.Errorf("list the KIP-848 groups: %w", err)
	}
	g, ok := lg[h.o.Group]
	return ok && g.GroupType == "consumer", nil
}

// Sweep removes the placeholder an earlier kcr standby left in the group
// (it was killed while holding it).
func (h *Hold) Sweep(member string) error {
	err := h.leaveGroup(member)
	h.report()
	if err != nil {
		return err
	}
	h.setMember("")
	return nil
}
