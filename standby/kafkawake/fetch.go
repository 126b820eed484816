package kafkawake

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchAll fetches once from every leader without waiting: the records
// found, and whether every partition was read up to its last stable offset.
func (v *view) fetchAll(ctx context.Context, w *Watcher) (work int64, caughtUp bool, err error) {
	caughtUp = true
	for leader, parts := range v.byLeader {
		before := positions(parts)
		n, done, err := w.fetch(ctx, v, leader, parts, 0)
		if err != nil {
			return 0, false, err
		}
		if !done && positions(parts) == before {
			rotate(parts) // see follow
		}
		work += n
		caughtUp = caughtUp && done
	}
	return work, caughtUp, nil
}

// fetch sends one read_committed Fetch to leader for parts, each from its
// position, which it moves past what it read. It returns the records a
// consumer would be handed, and whether every partition was read up to its
// last stable offset. The broker holds the request up to maxWait for a
// first byte.
func (w *Watcher) fetch(ctx context.Context, v *view, leader int32, parts []*part, maxWait time.Duration) (int64, bool, error) {
	req, byKey := fetchRequest(parts, maxWait)
	resp, err := req.RequestWith(ctx, w.cl.Broker(int(leader)))
	if err != nil {
		return 0, false, fmt.Errorf("fetch from broker %d: %w", leader, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, false, fmt.Errorf("fetch from broker %d: %w", leader, err)
	}
	var work int64
	caughtUp := true
	for _, rt := range resp.Topics {
		topic := rt.Topic
		if topic == "" {
			topic = v.names[kadm.TopicID(rt.TopicID)]
		}
		for _, rp := range rt.Partitions {
			pt := byKey[partKey(topic, rp.Partition)]
			if pt == nil {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				if errors.Is(err, kerr.OffsetOutOfRange) {
					return 0, false, w.clamp(ctx, pt)
				}
				return 0, false, fmt.Errorf("fetch %s/%d from broker %d: %w", topic, rp.Partition, leader, err)
			}
			n, next := records(rp.RecordBatches, pt.from, rp.AbortedTransactions)
			work += n
			pt.from = max(pt.from, next)
			stable := rp.LastStableOffset
			if stable < 0 {
				stable = rp.HighWatermark
			}
			caughtUp = caughtUp && pt.from >= stable
		}
	}
	return work, caughtUp, nil
}

// fetchRequest is a read_committed Fetch for parts, each from its
// position, held at the broker up to maxWait for a first byte; byKey finds
// the part of an answered partition (partKey).
func fetchRequest(parts []*part, maxWait time.Duration) (req *kmsg.FetchRequest, byKey map[string]*part) {
	req = kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(maxWait.Milliseconds())
	req.MinBytes = 1
	req.MaxBytes = 1 << 20
	req.IsolationLevel = 1 // read_committed
	req.SessionEpoch = -1  // no fetch session: every request is whole
	byKey = map[string]*part{}
	for _, pt := range parts {
		i := slices.IndexFunc(req.Topics, func(t kmsg.FetchRequestTopic) bool { return t.Topic == pt.topic })
		if i < 0 {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic, rt.TopicID = pt.topic, pt.id
			req.Topics = append(req.Topics, rt)
			i = len(req.Topics) - 1
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.FetchOffset = pt.p, pt.epoch, pt.from
		rp.LogStartOffset, rp.PartitionMaxBytes = -1, partitionMaxBytes
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
		byKey[partKey(pt.topic, pt.p)] = pt
	}
	return req, byKey
}

func partKey(topic string, p int32) string { return fmt.Sprintf("%s\x00%d", topic, p) }

// errMoved: a partition's position was out of range and was moved into it;
// the round starts again from there.
var errMoved = errors.New("a position was out of range")

// clamp moves pt's position into the partition's log, after an
// OFFSET_OUT_OF_RANGE: to its log start when records before it were
// deleted (the records from there are work), to its last stable offset
// when the log is shorter (a base then moves there).
func (w *Watcher) clamp(ctx context.Context, pt *part) error {
	starts, err := w.adm.ListStartOffsets(ctx, pt.topic)
	if err != nil {
		return fmt.Errorf("%s/%d out of range: list its start: %w", pt.topic, pt.p, err)
	}
	ends, err := w.adm.ListCommittedOffsets(ctx, pt.topic)
	if err != nil {
		return fmt.Errorf("%s/%d out of range: list its end: %w", pt.topic, pt.p, err)
	}
	s, ok1 := starts.Lookup(pt.topic, pt.p)
	e, ok2 := ends.Lookup(pt.topic, pt.p)
	if !ok1 || !ok2 || s.Err != nil || e.Err != nil {
		return fmt.Errorf("%s/%d out of range: its offsets are unknown", pt.topic, pt.p)
	}
	if pt.from > e.Offset && pt.base {
		w.setBase(pt.topic, pt.p, e.Offset)
	}
	w.log.Info("standby: kafka wake: a position out of range moved into the log", "group", w.cfg.Group,
		"topic", pt.topic, "partition", pt.p, "from", pt.from, "log_start", s.Offset, "stable_end", e.Offset)
	pt.from = min(max(pt.from, s.Offset), e.Offset)
	return errMoved
}

// records reads the record batches of a fetch from position from: the
// records a read_committed consumer would be handed (none of a control
// batch, none of an aborted transaction's batches, none before from), and
// the offset after the last batch read whole.
func records(data []byte, from int64, aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction) (int64, int64) {
	aborted = slices.SortedFunc(slices.Values(aborted), func(a, b kmsg.FetchResponseTopicPartitionAbortedTransaction) int {
		return cmp.Compare(a.FirstOffset, b.FirstOffset)
	})
	open := map[int64]bool{} // producers inside an aborted transaction
	var n int64
	next := from
	for len(data) >= 17 {
		size := 12 + int(int32(binary.BigEndian.Uint32(data[8:12])))
		if size < 17 || len(data) < size {
			break // the last batch, cut by the size limit
		}
		batch := data[:size]
		data = data[size:]
		if magic := batch[16]; magic < 2 {
			// A message set of the old formats: no transactions.
			if last := int64(binary.BigEndian.Uint64(batch[:8])); last >= from {
				n++
				next = max(next, last+1)
			}
			continue
		}
		var b kmsg.RecordBatch
		if b.ReadFrom(batch) != nil {
			break
		}
		last := b.FirstOffset + int64(b.LastOffsetDelta)
		for len(aborted) > 0 && aborted[0].FirstOffset <= last {
			open[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		const transactional, control = 0x10, 0x20
		switch {
		case b.Attributes&control != 0:
			// A commit or abort marker: it ends its producer's
			// transaction.
			delete(open, b.ProducerID)
		case b.Attributes&transactional != 0 && open[b.ProducerID]:
		case last >= from && b.NumRecords > 0:
			n += min(int64(b.NumRecords), last-max(from, b.FirstOffset)+1)
		}
		next = max(next, last+1)
	}
	return n, next
}
