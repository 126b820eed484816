package kgohooks

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Helpers for the per-partition maps and fetches that kgo and kadm use.

type tp struct {
	topic     string
	partition int32
}

// put sets m[k.topic][k.partition] to v, making the topic's map if needed.
func put[V any](m map[string]map[int32]V, k tp, v V) {
	ps := m[k.topic]
	if ps == nil {
		ps = map[int32]V{}
		m[k.topic] = ps
	}
	ps[k.partition] = v
}

// epochAt is exact offset o for kgo's SetOffsets and commits (no leader
// epoch).
func epochAt(o int64) kgo.EpochOffset { return kgo.EpochOffset{Epoch: -1, Offset: o} }

// keepPartitions returns fs with only the partitions keep returns true for;
// keep may change the partition it is given (its records). Topics and
// fetches left without partitions are dropped; fs itself is not changed.
func keepPartitions(fs kgo.Fetches, keep func(topic string, p *kgo.FetchPartition) bool) kgo.Fetches {
	out := fs[:0:0]
	for _, f := range fs {
		var ts []kgo.FetchTopic
		for _, t := range f.Topics {
			var ps []kgo.FetchPartition
			for _, p := range t.Partitions {
				if keep(t.Topic, &p) {
					ps = append(ps, p)
				}
			}
			if len(ps) > 0 {
				t.Partitions = ps
				ts = append(ts, t)
			}
		}
		if len(ts) > 0 {
			f.Topics = ts
			out = append(out, f)
		}
	}
	return out
}

// listed is a kadm listing with its per-partition errors folded into err.
func listed(lo kadm.ListedOffsets, err error) (kadm.ListedOffsets, error) {
	if err == nil {
		err = lo.Error()
	}
	return lo, err
}

// listEnds lists the ends of the topics' partitions as kgo resolves AtEnd:
// the high watermark, or with readCommitted the last stable offset.
func listEnds(ctx context.Context, adm *kadm.Client, readCommitted bool, topics ...string) (kadm.ListedOffsets, error) {
	if readCommitted {
		return listed(adm.ListCommittedOffsets(ctx, topics...))
	}
	return listed(adm.ListEndOffsets(ctx, topics...))
}

// nextReport is next offsets by "topic/partition", for Checkpoint.NextOffsets.
func nextReport(next map[tp]int64) map[string]int64 {
	m := make(map[string]int64, len(next))
	for k, at := range next {
		m[fmt.Sprintf("%s/%d", k.topic, k.partition)] = at
	}
	return m
}
