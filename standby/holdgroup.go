package standby

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// groupHold keeps a placeholder member in the service's classic consumer
// group while the service sleeps.
//
// A broker holds the first join of an empty classic group for
// group.initial.rebalance.delay.ms (3 s by default), and the service's
// hooks leave the group at every checkpoint: so every wake would pay the
// delay before the first record. With the placeholder in the group, the
// restored member's join is an ordinary rebalance. The placeholder pays the
// delay itself, in the background, right after the checkpoint; when the
// restored member joins, the placeholder sees the rebalance on its next
// heartbeat and leaves instead of rejoining, and the rebalance completes
// with the real members at once.
//
// The placeholder subscribes to the group's topics, is never assigned a
// partition, and commits nothing: the lag the watcher reads is the
// service's.
type groupHold struct {
	o   *Options
	log *slog.Logger
	cl  *kgo.Client
	adm *kadm.Client
	// setMember records the placeholder's member id in the state file, so
	// that a later kcr standby can remove it ("" once it left).
	setMember func(id string)
	reqs      atomic.Int64 // requests written, for Observer.BrokerRequests

	mu     sync.Mutex
	cancel context.CancelFunc // of the running hold; nil when none runs
	done   chan struct{}      // closed when it returned
	woken  chan struct{}      // closed by wake
}

// The placeholder's timing. Its heartbeats are slow while the service
// sleeps, and fast once a wake is pending: the restored member's join
// waits for the placeholder's next heartbeat.
const (
	holdSession     = 10 * time.Second // session and rebalance timeout
	holdBeatAsleep  = time.Second
	holdBeatWake    = 100 * time.Millisecond
	holdEmptyPoll   = time.Second
	holdWakeBound   = 30 * time.Second // the service may not use the group at all
	holdLeaveBudget = 5 * time.Second
	holdClientID    = "kcr-standby-hold"
	holdReason      = "kcr standby holds the group while the service sleeps"
)

// holdProtocols are the assignors the placeholder offers: a member can join
// only a group that has a protocol in common with every member's, so these
// are those of kafka-go, franz-go and the Java client.
var holdProtocols = []string{"range", "roundrobin", "sticky", "cooperative-sticky", "rack-affinity"}

// Results of a hold, for Observer.GroupHold.
const (
	HoldHeld     = "held"     // the placeholder is in the group
	HoldSkipped  = "skipped"  // nothing to hold: a KIP-848 group, or a wake came first
	HoldReleased = "released" // the placeholder left: the service (or another member) joined
	HoldFailed   = "failed"   // a request failed; the group may be empty
)

func newGroupHold(o *Options, log *slog.Logger, setMember func(string)) (*groupHold, error) {
	h := &groupHold{o: o, log: log, setMember: setMember}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...), kgo.ClientID(holdClientID),
		kgo.WithHooks(requestCounter{&h.reqs}))
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrBadOption, o.Brokers, err)
	}
	h.cl, h.adm = cl, kadm.NewClient(cl)
	return h, nil
}

// close stops a running hold (the placeholder leaves) and the client.
func (h *groupHold) close() {
	h.stop()
	h.cl.Close()
}

// start starts holding the group with a placeholder subscribed to topics,
// in the background; a hold still running (its wake pending) is stopped
// first.
func (h *groupHold) start(ctx context.Context, topics []string) {
	h.stop()
	ctx, cancel := context.WithCancel(ctx)
	done, woken := make(chan struct{}), make(chan struct{})
	h.mu.Lock()
	h.cancel, h.done, h.woken = cancel, done, woken
	h.mu.Unlock()
	go func() {
		defer close(done)
		defer h.report()
		h.run(ctx, slices.Clone(topics), woken)
	}()
}

// wake tells the running hold that the service is being restored: it
// leaves once the restored member joined.
func (h *groupHold) wake() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.woken != nil {
		close(h.woken)
		h.woken = nil
	}
}

// stop stops the running hold and waits until the placeholder left.
func (h *groupHold) stop() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.cancel, h.done, h.woken = nil, nil, nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// report passes the requests written since the last report on.
func (h *groupHold) report() {
	if n := h.reqs.Swap(0); n > 0 {
		h.o.Observer.BrokerRequests(int(n))
	}
}

func (h *groupHold) result(r string, attrs ...any) {
	h.o.Observer.GroupHold(r)
	lvl := slog.LevelInfo
	if r == HoldFailed {
		lvl = slog.LevelWarn
	}
	h.log.Log(context.Background(), lvl, "standby: group hold "+r, append([]any{"group", h.o.Group}, attrs...)...)
}

// isWoken reports whether woken is closed.
func isWoken(woken <-chan struct{}) bool {
	select {
	case <-woken:
		return true
	default:
		return false
	}
}

// run holds the group until the service woke and joined, or ctx ends. A
// placeholder that leaves because another member joined while the service
// sleeps holds the group again once it is empty.
func (h *groupHold) run(ctx context.Context, topics []string, woken <-chan struct{}) {
	for ctx.Err() == nil {
		if ok := h.waitEmpty(ctx, woken); !ok {
			return
		}
		if done := h.holdOnce(ctx, topics, woken); done {
			return
		}
	}
}

// waitEmpty waits until the group is an empty classic group: members
// keep it from being empty by themselves (an old member of the service
// that stays until its session times out, another instance of the
// service), and a KIP-848 group has no initial delay to avoid. It reports
// whether to join.
func (h *groupHold) waitEmpty(ctx context.Context, woken <-chan struct{}) bool {
	loggedErr, loggedMembers := false, false
	for {
		if isWoken(woken) {
			h.result(HoldSkipped, "reason", "woken before the group was empty")
			return false
		}
		empty, skip, err := h.groupEmpty(ctx)
		h.report()
		switch {
		case ctx.Err() != nil:
			return false
		case skip != "":
			h.result(HoldSkipped, "reason", skip)
			return false
		case err != nil:
			if !loggedErr {
				h.log.Warn("standby: group hold: describing the group failed; trying again", "group", h.o.Group, "err", err)
				loggedErr = true
			}
		case empty:
			return true
		case !loggedMembers:
			h.log.Info("standby: group hold: the group has members; holding it once it is empty", "group", h.o.Group)
			loggedMembers = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-woken:
		case <-time.After(holdEmptyPoll):
		}
	}
}

// groupEmpty describes the group: empty, or a reason not to hold it at all.
func (h *groupHold) groupEmpty(ctx context.Context) (empty bool, skip string, err error) {
	rctx, cancel := context.WithTimeout(ctx, holdSession)
	defer cancel()
	// A KIP-848 group has no initial delay; the classic protocol does not
	// describe it (or describes it as an empty classic group).
	kip848, err := h.isKIP848(rctx)
	if err != nil {
		return false, "", err
	}
	if kip848 {
		return false, "a KIP-848 group (no initial rebalance delay)", nil
	}
	ds, err := h.adm.DescribeGroups(rctx, h.o.Group)
	if err != nil {
		return false, "", fmt.Errorf("describe group %q: %w", h.o.Group, err)
	}
	d := ds[h.o.Group]
	switch {
	case errors.Is(d.Err, kerr.GroupIDNotFound), d.Err == nil && (d.State == "Dead" || d.State == ""):
		// No group: the placeholder makes it.
		return true, "", nil
	case d.Err != nil:
		return false, "", fmt.Errorf("describe group %q: %w", h.o.Group, d.Err)
	case d.ProtocolType != "consumer" && d.ProtocolType != "":
		return false, fmt.Sprintf("protocol type %q is not that of a consumer group", d.ProtocolType), nil
	case d.Protocol != "" && !slices.Contains(holdProtocols, d.Protocol):
		// The placeholder must share it, or the service could not
		// join after it.
		return false, fmt.Sprintf("the group's assignor %q is not one the placeholder offers", d.Protocol), nil
	}
	return d.State == "Empty", "", nil
}

// isKIP848 reports whether the group is a KIP-848 ("consumer" type) group.
// A broker without KIP-848 ignores the type filter and leaves the type
// empty.
func (h *groupHold) isKIP848(ctx context.Context) (bool, error) {
	lg, err := h.adm.ListGroupsByType(ctx, []string{"consumer"})
	if err != nil {
		return false, fmt.Errorf("list the KIP-848 groups: %w", err)
	}
	g, ok := lg[h.o.Group]
	return ok && g.GroupType == "consumer", nil
}

// joined is the placeholder in one generation of the group.
type joined struct {
	member     string
	generation int32
	protocol   string
}

// holdOnce joins the group, and heartbeats until a rebalance, the wake
// bound or ctx: then it leaves. done is false when the placeholder left
// while the service sleeps (another member joined): the caller holds the
// group again once it is empty.
func (h *groupHold) holdOnce(ctx context.Context, topics []string, woken <-chan struct{}) (done bool) {
	j, others, err := h.join(ctx, topics)
	if err != nil {
		if j.member != "" {
			h.leave(j.member)
		}
		if ctx.Err() != nil {
			return true
		}
		h.result(HoldFailed, "err", err)
		return isWoken(woken) || h.pause(ctx, woken)
	}
	if others {
		// Not empty without the placeholder: syncing would hand the
		// others empty assignments (as leader), or take partitions
		// from them (as follower).
		h.leave(j.member)
		h.result(HoldReleased, "reason", "other members joined with the placeholder", "woken", isWoken(woken))
		return isWoken(woken)
	}
	if err := h.sync(ctx, j); err != nil {
		h.leave(j.member)
		if ctx.Err() != nil {
			return true
		}
		if errors.Is(err, kerr.RebalanceInProgress) {
			h.result(HoldReleased, "reason", "a member joined", "woken", isWoken(woken))
			return isWoken(woken)
		}
		h.result(HoldFailed, "err", err)
		return isWoken(woken) || h.pause(ctx, woken)
	}
	h.result(HoldHeld, "member_id", j.member, "generation", j.generation, "protocol", j.protocol)
	return h.heartbeat(ctx, j, woken)
}

// pause waits a heartbeat interval after a failure; it reports whether
// the hold is over.
func (h *groupHold) pause(ctx context.Context, woken <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return true
	case <-woken:
		return true
	case <-time.After(holdEmptyPoll):
		return false
	}
}

// join joins the group; others tells whether members other than the
// placeholder are in the generation it joined.
func (h *groupHold) join(ctx context.Context, topics []string) (j joined, others bool, err error) {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = topics
	mb := meta.AppendTo(nil)
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = h.o.Group
	req.SessionTimeoutMillis = int32(holdSession.Milliseconds())
	req.RebalanceTimeoutMillis = int32(holdSession.Milliseconds())
	req.ProtocolType = "consumer"
	reason := holdReason
	req.Reason = &reason
	for _, name := range holdProtocols {
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = name, mb
		req.Protocols = append(req.Protocols, p)
	}
	for attempt := 0; ; attempt++ {
		req.MemberID = j.member
		resp, err := req.RequestWith(ctx, h.cl)
		h.report()
		if err != nil {
			return j, false, fmt.Errorf("join group %q: %w", h.o.Group, err)
		}
		err = kerr.ErrorForCode(resp.ErrorCode)
		switch {
		case err == nil:
			j.generation = resp.Generation
			if resp.Protocol != nil {
				j.protocol = *resp.Protocol
			}
			others = resp.LeaderID != j.member || slices.ContainsFunc(resp.Members, func(m kmsg.JoinGroupResponseMember) bool {
				return m.MemberID != j.member
			})
			return j, others, nil
		case attempt >= 5:
			return j, false, fmt.Errorf("join group %q: %w", h.o.Group, err)
		case errors.Is(err, kerr.MemberIDRequired):
			// Recorded before the join that makes it a member, so that
			// a kcr standby killed meanwhile leaves a trace to sweep.
			j.member = resp.MemberID
			h.setMember(j.member)
		case errors.Is(err, kerr.UnknownMemberID):
			j.member = ""
		case errors.Is(err, kerr.RebalanceInProgress):
		default:
			return j, false, fmt.Errorf("join group %q: %w", h.o.Group, err)
		}
	}
}

// sync completes the placeholder's generation as its leader: an empty
// assignment for every member (the placeholder alone).
func (h *groupHold) sync(ctx context.Context, j joined) error {
	assign := kmsg.NewConsumerMemberAssignment()
	ab := assign.AppendTo(nil)
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.Generation, req.MemberID = h.o.Group, j.generation, j.member
	ptype := "consumer"
	req.ProtocolType, req.Protocol = &ptype, &j.protocol
	a := kmsg.NewSyncGroupRequestGroupAssignment()
	a.MemberID, a.MemberAssignment = j.member, ab
	req.GroupAssignment = append(req.GroupAssignment, a)
	resp, err := req.RequestWith(ctx, h.cl)
	h.report()
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("sync group %q: %w", h.o.Group, err)
	}
	return nil
}

// heartbeat keeps the placeholder in the group until a rebalance begins
// (a member joins: the placeholder leaves instead of rejoining), the wake
// bound passes, or ctx ends. It reports whether the hold is over.
func (h *groupHold) heartbeat(ctx context.Context, j joined, woken <-chan struct{}) bool {
	every := holdBeatAsleep
	var bound <-chan time.Time
	if isWoken(woken) {
		every, woken = holdBeatWake, nil
		bound = time.After(holdWakeBound)
	}
	t := time.NewTimer(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			h.leave(j.member)
			return true
		case <-woken:
			every, woken = holdBeatWake, nil
			bound = time.After(holdWakeBound)
			t.Reset(every)
			continue
		case <-bound:
			h.leave(j.member)
			h.result(HoldReleased, "reason", "no member joined within "+holdWakeBound.String()+" of the wake")
			return true
		case <-t.C:
		}
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.Generation, req.MemberID = h.o.Group, j.generation, j.member
		rctx, cancel := context.WithTimeout(ctx, holdSession/2)
		resp, err := req.RequestWith(rctx, h.cl)
		cancel()
		h.report()
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		awake := bound != nil
		switch {
		case ctx.Err() != nil:
			h.leave(j.member)
			return true
		case err == nil:
			if failing {
				h.log.Info("standby: group hold: heartbeats work again", "group", h.o.Group)
			}
			failing = false
		case errors.Is(err, kerr.RebalanceInProgress):
			// A member joined: the service, restored, or another one.
			// Leaving now lets the rebalance complete without the
			// placeholder, and the group is not empty without it.
			h.leave(j.member)
			h.result(HoldReleased, "reason", "a member joined", "woken", awake)
			return awake
		case errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.FencedInstanceID):
			h.setMember("")
			h.result(HoldFailed, "reason", "the placeholder was removed from the group", "err", err)
			return awake
		default:
			if !failing {
				h.log.Warn("standby: group hold: heartbeat failed; trying again", "group", h.o.Group, "err", err)
			}
			failing = true
		}
		t.Reset(every)
	}
}

// leave removes member from the group, whatever ctx the hold had: a
// placeholder left behind would keep the group from being empty until its
// session times out.
func (h *groupHold) leave(member string) {
	if err := h.leaveGroup(member); err != nil {
		h.log.Warn("standby: group hold: leaving the group failed; the placeholder stays until its session times out", "group", h.o.Group, "member_id", member, "err", err)
		return
	}
	h.setMember("")
}

// leaveGroup sends a LeaveGroup for member; a member the group does not
// know (any more) has left.
func (h *groupHold) leaveGroup(member string) error {
	ctx, cancel := context.WithTimeout(context.Background(), holdLeaveBudget)
	defer cancel()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group, req.MemberID = h.o.Group, member
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = member
	reason := holdReason
	m.Reason = &reason
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, h.cl)
	h.report()
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, m := range resp.Members {
			if err == nil {
				err = kerr.ErrorForCode(m.ErrorCode)
			}
		}
	}
	if errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.GroupIDNotFound) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("leave group %q as %s: %w", h.o.Group, member, err)
	}
	return nil
}

// sweep removes the placeholder an earlier kcr standby left in the group
// (it was killed while holding it).
func (h *groupHold) sweep(member string) error {
	err := h.leaveGroup(member)
	h.report()
	if err != nil {
		return err
	}
	h.setMember("")
	return nil
}
