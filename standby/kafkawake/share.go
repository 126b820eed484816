package kafkawake

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ShareBacklog returns a share group's unfinished records per topic and
// partition: those past the share-partition start offset that no member has
// acknowledged yet (available, or acquired and in flight), as the broker
// reports them (DescribeShareGroupOffsets v1, KIP-1226: Kafka 4.2+). A
// partition the group has not initialized yet, or where it has not
// acknowledged a record yet (the broker reports no start offset there), is
// left out. One request to the group's coordinator; nothing is fetched.
func ShareBacklog(ctx context.Context, cl *kgo.Client, group string) (map[string]map[int32]int64, error) {
	d, err := describeShare(ctx, cl, group)
	return d.lags, err
}

// shareOffsets is what the broker reports of a share group's partitions.
type shareOffsets struct {
	// lags and starts (the share-partition start offsets: the oldest
	// record no member has acknowledged) per topic and partition.
	lags, starts map[string]map[int32]int64
	// unknown are the partitions the group has initialized but not
	// acknowledged a record in yet: the broker reports no start offset
	// nor lag for them.
	unknown map[string][]int32
}

// describeShare reads the share group's offsets of every topic it has some
// for.
func describeShare(ctx context.Context, cl *kgo.Client, group string) (shareOffsets, error) {
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	g.GroupID = group // no topics: every topic the group has offsets for
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return shareOffsets{}, fmt.Errorf("share group %s: describe offsets: %w", group, err)
	}
	if resp.Version < 1 {
		return shareOffsets{}, fmt.Errorf("share group %s: the broker does not report share-group lag (DescribeShareGroupOffsets v%d; Kafka 4.2+ has v1)", group, resp.Version)
	}
	d := shareOffsets{lags: map[string]map[int32]int64{}, starts: map[string]map[int32]int64{}, unknown: map[string][]int32{}}
	for _, rg := range resp.Groups {
		if err := kerr.ErrorForCode(rg.ErrorCode); err != nil {
			return shareOffsets{}, fmt.Errorf("share group %s: %w", group, err)
		}
		for _, t := range rg.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return shareOffsets{}, fmt.Errorf("share group %s: %s/%d: %w", group, t.Topic, p.Partition, err)
				}
				if p.StartOffset < 0 || p.Lag < 0 {
					d.unknown[t.Topic] = append(d.unknown[t.Topic], p.Partition)
					continue
				}
				if d.lags[t.Topic] == nil {
					d.lags[t.Topic], d.starts[t.Topic] = map[int32]int64{}, map[int32]int64{}
				}
				d.lags[t.Topic][p.Partition] = p.Lag
				d.starts[t.Topic][p.Partition] = p.StartOffset
			}
		}
	}
	return d, nil
}
