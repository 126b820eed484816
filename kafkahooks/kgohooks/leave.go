package kgohooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// groupMember names a member of the group; instanceID is "" for a dynamic
// one.
type groupMember struct {
	memberID, instanceID string
}

func (m groupMember) String() string {
	if m.instanceID == "" {
		return fmt.Sprintf("member %q", m.memberID)
	}
	return fmt.Sprintf("static member %q (instance %q)", m.memberID, m.instanceID)
}

// leaveMember removes m from the group with cl, which need not be m's own
// client: kgo does not remove a static member (static.go), and a member
// whose leave could not reach the broker is removed by the next client. It
// uses the KIP-848 leave (ConsumerGroupHeartbeat, member epoch -1) when the
// client was configured with kgo.ServerSideBalancer, and a LeaveGroup naming
// the member when the group is classic (kgo fell back, or no
// ServerSideBalancer). A member the broker no longer knows has left.
func (c *core) leaveMember(ctx context.Context, cl *kgo.Client, m groupMember) error {
	if m.memberID == "" {
		return nil // it never joined
	}
	var err848 error
	if c.serverSide {
		if err848 = leave848(ctx, cl, c.group, m); err848 == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err848
		}
	}
	err := leaveClassic(ctx, cl, c.group, m)
	if err == nil {
		return nil
	}
	// A member unknown to both protocols is gone (an earlier attempt of
	// ours, or its session expired).
	if errors.Is(err, kerr.UnknownMemberID) && (!c.serverSide || errors.Is(err848, kerr.UnknownMemberID) || errors.Is(err848, kerr.GroupIDNotFound)) {
		return nil
	}
	if err848 != nil {
		return fmt.Errorf("kgohooks: removing %v from group %q: %w (KIP-848 leave: %v)", m, c.group, err, err848)
	}
	return fmt.Errorf("kgohooks: removing %v from group %q: %w", m, c.group, err)
}

// removeUnleft removes m, the member a checkpoint could not remove, with
// the new client cl. It tries again while the broker cannot be reached or
// answers with a retriable error, until cl is closed or 5 minutes have
// passed (the default sessions end m within 45 s). Copies restored from one
// image all try: the first removes m, the others find it unknown.
func (c *core) removeUnleft(cl *kgo.Client, m groupMember) {
	ctx, cancel := context.WithTimeout(cl.Context(), 5*time.Minute)
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.leaveMember(rctx, cl, m)
		rcancel()
		if err == nil {
			c.cfg.log.Info("removed the group member the checkpoint could not remove", "group", c.group, "member", m.memberID)
			return
		}
		if ke := (*kerr.Error)(nil); errors.As(err, &ke) && !ke.Retriable {
			// The broker answered, and no retry changes its answer.
			c.cfg.log.Warn("could not remove the group member the checkpoint left behind; its session ends it", "group", c.group, "member", m.memberID, "err", err)
			return
		}
		select {
		case <-ctx.Done():
			c.cfg.log.Warn("could not remove the group member the checkpoint left behind; its session ends it", "group", c.group, "member", m.memberID, "err", err)
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// leave848 sends the KIP-848 full leave (member epoch -1) of a member.
func leave848(ctx context.Context, cl *kgo.Client, group string, m groupMember) error {
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group = group
	req.MemberID = m.memberID
	req.MemberEpoch = -1
	if m.instanceID != "" {
		req.InstanceID = &m.instanceID
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// leaveClassic sends a LeaveGroup for a member of a classic group.
func leaveClassic(ctx context.Context, cl *kgo.Client, group string, m groupMember) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	req.MemberID = m.memberID
	rm := kmsg.NewLeaveGroupRequestMember()
	rm.MemberID = m.memberID
	if m.instanceID != "" {
		rm.InstanceID = &m.instanceID
		rm.Reason = kmsg.StringPtr("kcr checkpoint: the static member leaves; restored copies join under their own instance ids")
	} else {
		rm.Reason = kmsg.StringPtr("kcr: the member a checkpoint could not remove (the broker was unreachable)")
	}
	req.Members = append(req.Members, rm)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	for _, m := range resp.Members {
		if err := kerr.ErrorForCode(m.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}
