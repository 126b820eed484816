package kafkastandby

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// holdMember is the placeholder: one member of the group.
type holdMember struct {
	id         string // "" before its first join, and once it left
	generation int32
	protocol   string
	held       bool // HoldHeld reported
	// rebalance is the rebalance timeout its joins offer: holdRebalance,
	// or holdEmptyRebalance until its join into an empty group completed.
	rebalance time.Duration
}

var (
	// errRejoin: a rebalance began, or the placeholder missed one.
	errRejoin = errors.New("the group rebalances")
	// errLeft: the placeholder left, for the real members lead the group.
	errLeft = errors.New("the placeholder left: other members lead the group")
)

// removed reports whether err says the placeholder is no longer a member.
func removed(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.FencedInstanceID) || errors.Is(err, kerr.GroupIDNotFound)
}

// hold keeps m in the group through every rebalance until ctx ends or
// the group no longer needs it. slept is closed once the service's member
// left; quiet once m holds the group alone among replicas (slept, for a
// single service): until then m heartbeats fast and, leading real
// members, rejoins as a follower.
func (h *Hold) hold(ctx context.Context, m *holdMember, slept, quiet <-chan struct{}) {
	failing := false
	for ctx.Err() == nil {
		if m.id == "" {
			join, empty := h.canRejoin(ctx, !isClosed(slept))
			if !join {
				return
			}
			m.rebalance = holdRebalance
			if empty {
				m.rebalance = holdEmptyRebalance
			}
			if err := h.memberID(ctx, m); err != nil {
				h.result(HoldFailed, "err", err)
				if !sleepCtx(ctx, holdRetry) {
					return
				}
				continue
			}
		}
		err := h.joinSync(ctx, m)
		if err == nil {
			failing = false
			m.rebalance = holdRebalance
			if !m.held {
				m.held = true
				h.result(HoldHeld, "member_id", m.id, "generation", m.generation, "protocol", m.protocol)
			}
			err = h.heartbeat(ctx, m, quiet)
		}
		h.report()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errRejoin):
		case errors.Is(err, errLeft):
			if isClosed(quiet) {
				h.result(HoldReleased, "reason", "other members lead the group")
				return
			}
			// The service's member is still in: join again, as a
			// follower, before it leaves.
		case removed(err):
			h.log.Info("standby: group hold: the placeholder was removed from the group", "group", h.o.Group, "member_id", m.id, "err", err)
			m.id = ""
			h.setMember("")
		default:
			if !failing {
				h.log.Warn("standby: group hold: the placeholder's requests fail; trying again", "group", h.o.Group, "err", err)
				failing = true
			}
			if !sleepCtx(ctx, holdRetry) {
				return
			}
		}
	}
}

// canRejoin decides, the placeholder removed (its session expired while
// the broker was down, another kcr standby released the group), whether
// a new one joins: while the service checkpoints (armed), into a group
// with members; asleep, only into an empty classic group, which would be
// left empty otherwise (a group with members is held by them). A missing
// group is not created; a KIP-848 group has no delay. empty: the join
// goes into an empty group, and starts the broker's initial delay.
func (h *Hold) canRejoin(ctx context.Context, armed bool) (join, empty bool) {
	for ctx.Err() == nil {
		kip848, err := h.isKIP848(ctx)
		var g holdGroup
		if err == nil {
			g, err = h.describe(ctx)
		}
		h.report()
		switch {
		case ctx.Err() != nil:
			return false, false
		case err != nil:
			if !sleepCtx(ctx, holdRetry) {
				return false, false
			}
			continue
		case kip848:
			h.result(HoldSkipped, "reason", "a KIP-848 group (no initial rebalance delay)")
		case !g.exists:
			h.result(HoldSkipped, "reason", "the group is gone; the hold does not create it")
		case armed && len(g.real) > 0:
			return true, false
		case len(g.real)+len(g.placeholders) > 0:
			h.result(HoldReleased, "reason", "other members hold the group")
		case g.protocolType != "" && g.protocolType != "consumer":
			h.result(HoldSkipped, "reason", fmt.Sprintf("protocol type %q is not that of a consumer group", g.protocolType))
		default:
			h.log.Info("standby: group hold: the group is empty; the placeholder joins it again", "group", h.o.Group)
			return true, true
		}
		return false, false
	}
	return false, false
}

// memberID makes m's first join: the broker answers with the member id
// the next join makes a member (MEMBER_ID_REQUIRED).
//
// The broker keeps that id as a pending member for the first join's
// session, and a rebalance waits for it. A kcr standby killed before it
// recorded the id leaves one that no later one can remove (the soak: a
// restored member's join waited 21 s for such a member). So the first join
// asks for the shortest session a broker allows by default
// (group.min.session.timeout.ms), and holdSession where that is refused.
func (h *Hold) memberID(ctx context.Context, m *holdMember) error {
	m.id, m.held = "", false
	resp, err := h.joinRequest(m, holdPendingSession).RequestWith(ctx, h.cl)
	h.report()
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if errors.Is(err, kerr.InvalidSessionTimeout) {
		resp, err = h.joinRequest(m, holdSession).RequestWith(ctx, h.cl)
		h.report()
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
	}
	if !errors.Is(err, kerr.MemberIDRequired) {
		if err == nil {
			// A broker before MEMBER_ID_REQUIRED: the join made the
			// member; the next join is a rejoin.
			return h.record(m, resp.MemberID)
		}
		return fmt.Errorf("join group %q: %w", h.o.Group, err)
	}
	// Recorded before the join that makes it a member, so that a kcr
	// standby killed meanwhile leaves a trace to sweep.
	return h.record(m, resp.MemberID)
}

// record writes the placeholder's member id id in the state file before
// it becomes m's. A placeholder the state file does not name is one no
// later kcr standby could remove: if a kcr standby killed meanwhile left
// it, it would hold up every rebalance of the group until its session
// ends (30 s, counted again from a broker restart). So when the record
// fails (a full disk), the broker's pending member is removed and the
// group is not held.
func (h *Hold) record(m *holdMember, id string) error {
	if err := h.setMember(id); err != nil {
		if lerr := h.leaveGroup(id); lerr != nil {
			h.log.Warn("standby: group hold: removing the placeholder the state file could not record failed; its session ends it", "group", h.o.Group, "member_id", id, "err", lerr)
		}
		h.clearMember(id)
		return fmt.Errorf("the placeholder is not recorded, so it does not join: %w", err)
	}
	m.id = id
	return nil
}

// joinRequest is the placeholder's JoinGroup: the service's protocol,
// with a subscription to no topic.
func (h *Hold) joinRequest(m *holdMember, session time.Duration) *kmsg.JoinGroupRequest {
	meta := kmsg.NewConsumerMemberMetadata()
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.MemberID = h.o.Group, m.id
	req.SessionTimeoutMillis = int32(session.Milliseconds())
	req.RebalanceTimeoutMillis = int32(cmp.Or(m.rebalance, holdRebalance).Milliseconds())
	req.ProtocolType = "consumer"
	reason := holdReason
	req.Reason = &reason
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = h.protocol(), meta.AppendTo(nil)
	req.Protocols = append(req.Protocols, p)
	return req
}

// joinSync makes m a member of the next generation: it joins, and syncs.
// As the leader it gives every member an empty assignment when all are
// placeholders; with real members it cannot run their assignor, so it
// leaves (errLeft) and they rebalance without it.
func (h *Hold) joinSync(ctx context.Context, m *holdMember) error {
	resp, err := h.joinRequest(m, holdSession).RequestWith(ctx, h.cl)
	h.report()
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if errors.Is(err, kerr.RebalanceInProgress) {
		return errRejoin
	}
	if err != nil {
		return fmt.Errorf("join group %q: %w", h.o.Group, err)
	}
	m.generation = resp.Generation
	if resp.Protocol != nil {
		m.protocol = *resp.Protocol
	}
	sreq := kmsg.NewPtrSyncGroupRequest()
	sreq.Group, sreq.Generation, sreq.MemberID = h.o.Group, m.generation, m.id
	ptype := "consumer"
	sreq.ProtocolType, sreq.Protocol = &ptype, &m.protocol
	if resp.LeaderID == m.id {
		empty := kmsg.NewConsumerMemberAssignment()
		for _, mem := range resp.Members {
			if !isPlaceholder("", mem.MemberID) {
				h.leave(m.id)
				m.id = ""
				return errLeft
			}
			a := kmsg.NewSyncGroupRequestGroupAssignment()
			a.MemberID, a.MemberAssignment = mem.MemberID, empty.AppendTo(nil)
			sreq.GroupAssignment = append(sreq.GroupAssignment, a)
		}
	}
	sresp, err := sreq.RequestWith(ctx, h.cl)
	h.report()
	if err == nil {
		err = kerr.ErrorForCode(sresp.ErrorCode)
	}
	switch {
	case errors.Is(err, kerr.RebalanceInProgress), errors.Is(err, kerr.IllegalGeneration):
		return errRejoin
	case err != nil:
		return fmt.Errorf("sync group %q: %w", h.o.Group, err)
	}
	return nil
}

// heartbeat keeps m in its generation until a rebalance begins (errRejoin),
// m is removed, or ctx ends. Heartbeats are fast while the service
// checkpoints, so that m rejoins as soon as the service's member left.
func (h *Hold) heartbeat(ctx context.Context, m *holdMember, slept <-chan struct{}) error {
	every := holdBeatArmed
	if isClosed(slept) {
		every, slept = holdBeatAsleep, nil
	}
	t := time.NewTimer(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-slept:
			every, slept = holdBeatAsleep, nil
			t.Reset(every)
			continue
		case <-t.C:
		}
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.Generation, req.MemberID = h.o.Group, m.generation, m.id
		rctx, cancel := context.WithTimeout(ctx, holdSession/2)
		resp, err := req.RequestWith(rctx, h.cl)
		cancel()
		h.report()
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			if failing {
				h.log.Info("standby: group hold: heartbeats work again", "group", h.o.Group)
			}
			failing = false
		case errors.Is(err, kerr.RebalanceInProgress), errors.Is(err, kerr.IllegalGeneration):
			return errRejoin
		case removed(err):
			return err
		default:
			// The coordinator moves or restarts: the session outlasts it.
			if !failing {
				h.log.Warn("standby: group hold: heartbeat failed; trying again", "group", h.o.Group, "err", err)
			}
			failing = true
		}
		t.Reset(every)
	}
}

// leave removes member from the group, whatever ctx the hold had: a
// placeholder left behind would stay until its session times out, and the
// rebalance a restored member's join starts would wait for it. A leave
// that fails (the broker is unreachable) is tried again in the background.
func (h *Hold) leave(member string) {
	if err := h.leaveGroup(member); err != nil {
		h.log.Warn("standby: group hold: leaving the group failed; trying again until its session ends", "group", h.o.Group, "member_id", member, "err", err)
		go h.LeaveLater(member)
		return
	}
	h.clearMember(member)
}

// LeaveLater tries member's leave again until it succeeds, its session has
// surely ended, or the hold's client is closed (kcr standby stops: the state
// file keeps the member for the next one's sweep).
func (h *Hold) LeaveLater(member string) {
	end := time.Now().Add(holdSession + holdLeaveBudget)
	for time.Now().Before(end) {
		select {
		case <-h.cl.Context().Done():
			return
		case <-time.After(holdLeaveRetry):
		}
		if err := h.leaveGroup(member); err == nil {
			h.log.Info("standby: group hold: the placeholder left the group", "group", h.o.Group, "member_id", member)
			h.clearMember(member)
			return
		}
	}
}

// clearMember forgets member in the state file, unless another placeholder
// was recorded since.
func (h *Hold) clearMember(member string) {
	h.mu.Lock()
	other := h.saved.HoldMember != member
	h.mu.Unlock()
	if !other {
		h.setMember("")
	}
}

// leaveGroup removes members from the group; a member the group does not
// know (any more) has left.
func (h *Hold) leaveGroup(members ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), holdLeaveBudget)
	defer cancel()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = h.o.Group
	reason := holdReason
	for _, id := range members {
		m := kmsg.NewLeaveGroupRequestMember()
		m.MemberID, m.Reason = id, &reason
		req.Members = append(req.Members, m)
	}
	resp, err := req.RequestWith(ctx, h.cl)
	h.report()
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, m := range resp.Members {
			if e := kerr.ErrorForCode(m.ErrorCode); err == nil && !errors.Is(e, kerr.UnknownMemberID) {
				err = e
			}
		}
	}
	if errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.GroupIDNotFound) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("leave group %q as %v: %w", h.o.Group, members, err)
	}
	return nil
}

// isClosed reports whether ch is closed (a nil ch is not).
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
