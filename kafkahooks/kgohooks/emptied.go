package kgohooks

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// leavesGroupEmpty reports whether memberID, about to leave, is the last
// member of a classic group. The broker holds the first join to an empty
// classic group for group.initial.rebalance.delay.ms (3 s by default), so a
// copy restored from this image waits that long for its first record; a
// KIP-848 group (kgo.ServerSideBalancer) has no such delay. Any error
// answers false: this only informs the report.
func (c *core) leavesGroupEmpty(ctx context.Context, s *state, memberID string) bool {
	if c.serverSide || memberID == "" {
		return false
	}
	ctx, cancel := share(ctx, 0.1)
	defer cancel()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{c.group}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil || len(resp.Groups) != 1 || resp.Groups[0].ErrorCode != 0 {
		return false
	}
	for _, m := range resp.Groups[0].Members {
		if m.MemberID != memberID {
			return false
		}
	}
	c.cfg.log.Info("this member leaves its classic group empty: a restored copy waits group.initial.rebalance.delay.ms (3 s by default) for its first record; kgo.ServerSideBalancer() (KIP-848) has no such delay",
		"group", c.group)
	return true
}
