package kgohooks

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Static members (kgo.InstanceID).
//
// An image carries the instance id, and every copy restored from it would
// join under it: clones fence each other (FENCED_INSTANCE_ID, or
// UNRELEASED_INSTANCE_ID with KIP-848), and a copy of a --leave-running
// image takes the original's membership. So on every restore the instance
// id becomes base + "-" + the first 8 hex digits of the instance id
// (notify.Event.ShortID), like the client id; a resume keeps it.
//
// kgo never removes a static member from its group: it sends no LeaveGroup
// for a classic one, and a KIP-848 one leaves with member epoch -2, which
// keeps its partitions reserved until the session timeout or until a member
// with the same instance id joins. (kgo v1.22.3 even sends that -2 without
// the instance id, which Kafka 4.3 refuses: INVALID_REQUEST "InstanceId
// can't be null".) No copy comes back under that instance id, so the
// checkpoint removes the member itself (leaveStatic), whatever kgo's leave
// returned, and the other members take its partitions at once, as they do
// for a dynamic one.

// restoredInstanceID returns the instance id of a copy restored with short
// (notify.Event.ShortID), or "" for a dynamic member.
func (c *core) restoredInstanceID(short string) string {
	if c.baseInstanceID == "" {
		return ""
	}
	return c.baseInstanceID + "-" + short
}

// leaveStatic removes the static member memberID (instance id instanceID)
// of the group from it, after kgo's own leave (see above). It uses the
// KIP-848 leave (ConsumerGroupHeartbeat, member epoch -1) when the client
// was configured with kgo.ServerSideBalancer, and a LeaveGroup naming the
// instance when the group is classic (kgo fell back, or no
// ServerSideBalancer). A member the broker no longer knows has left.
func (c *core) leaveStatic(ctx context.Context, cl *kgo.Client, memberID, instanceID string) error {
	if memberID == "" {
		return nil // it never joined
	}
	var err848 error
	if c.serverSide {
		if err848 = leave848(ctx, cl, c.group, memberID, instanceID); err848 == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err848
		}
	}
	err := leaveClassic(ctx, cl, c.group, memberID, instanceID)
	if err == nil {
		return nil
	}
	// A member unknown to both protocols is gone (an earlier attempt of
	// ours, or its session expired).
	if errors.Is(err, kerr.UnknownMemberID) && (!c.serverSide || errors.Is(err848, kerr.UnknownMemberID) || errors.Is(err848, kerr.GroupIDNotFound)) {
		return nil
	}
	if err848 != nil {
		return fmt.Errorf("kgohooks: removing static member %q (instance %q) from group %q: %w (KIP-848 leave: %v)", memberID, instanceID, c.group, err, err848)
	}
	return fmt.Errorf("kgohooks: removing static member %q (instance %q) from group %q: %w", memberID, instanceID, c.group, err)
}

// leave848 sends the KIP-848 full leave (member epoch -1) of a member.
func leave848(ctx context.Context, cl *kgo.Client, group, memberID, instanceID string) error {
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group = group
	req.MemberID = memberID
	req.MemberEpoch = -1
	req.InstanceID = &instanceID
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// leaveClassic sends a LeaveGroup for the static member of a classic group.
func leaveClassic(ctx context.Context, cl *kgo.Client, group, memberID, instanceID string) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	req.MemberID = memberID
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = memberID
	m.InstanceID = &instanceID
	m.Reason = kmsg.StringPtr("kcr checkpoint: the static member leaves; restored copies join under their own instance ids")
	req.Members = append(req.Members, m)
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

// InstanceID returns the group instance id (kgo.InstanceID) of the current
// kgo client: the configured one, suffixed after a restore; "" for a
// dynamic member.
func (c *core) InstanceID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.instanceID
}
