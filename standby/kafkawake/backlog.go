package kafkawake

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Backlog is the group's unprocessed work at one moment: what tells a
// sleeping replica whether the running ones keep up.
type Backlog struct {
	// Records is the lag: past the group's commits, up to each
	// partition's last stable offset (transaction markers included).
	Records int64
	// Oldest is the timestamp of the oldest record past the commits (the
	// first batch's, which may be a little older); zero without lag.
	Oldest time.Time
}

// Age is how old the oldest unprocessed record is at now (0 without one).
func (b Backlog) Age(now time.Time) time.Duration {
	if b.Oldest.IsZero() || b.Records == 0 {
		return 0
	}
	return max(0, now.Sub(b.Oldest))
}

// Backlog reads the group's lag and the age of its oldest unprocessed
// record: the commits, then one Fetch per partition leader from them,
// without waiting at the broker.
func (w *Watcher) Backlog(ctx context.Context) (Backlog, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := w.setup(ctx)
	if err != nil {
		return Backlog{}, err
	}
	var b Backlog
	for leader, parts := range v.byLeader {
		req, byKey := fetchRequest(parts, 0)
		resp, err := req.RequestWith(ctx, w.cl.Broker(int(leader)))
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			return Backlog{}, fmt.Errorf("fetch from broker %d: %w", leader, err)
		}
		addBacklog(&b, v, resp, byKey)
	}
	return b, nil
}

// addBacklog adds the lag and oldest record of one leader's answer to b.
func addBacklog(b *Backlog, v *view, resp *kmsg.FetchResponse, byKey map[string]*part) {
	for _, rt := range resp.Topics {
		topic := rt.Topic
		if topic == "" {
			topic = v.names[kadm.TopicID(rt.TopicID)]
		}
		for _, rp := range rt.Partitions {
			pt := byKey[partKey(topic, rp.Partition)]
			if pt == nil || kerr.ErrorForCode(rp.ErrorCode) != nil {
				continue
			}
			end := rp.LastStableOffset
			if end < 0 {
				end = rp.HighWatermark
			}
			if end <= pt.from {
				continue
			}
			b.Records += end - pt.from
			if ts := firstTimestamp(rp.RecordBatches, pt.from); ts > 0 {
				if t := time.UnixMilli(ts); b.Oldest.IsZero() || t.Before(b.Oldest) {
					b.Oldest = t
				}
			}
		}
	}
}

// firstTimestamp is the first timestamp (ms) of the first data batch in
// data that holds a record at or past from; 0 if none was read whole.
func firstTimestamp(data []byte, from int64) int64 {
	for len(data) >= 17 {
		size := 12 + int(int32(binary.BigEndian.Uint32(data[8:12])))
		if size < 17 || len(data) < size {
			return 0
		}
		batch := data[:size]
		data = data[size:]
		if batch[16] < 2 {
			continue // the old formats: no batch timestamp
		}
		var rb kmsg.RecordBatch
		if rb.ReadFrom(batch) != nil {
			return 0
		}
		const control = 0x20
		if rb.Attributes&control == 0 && rb.FirstOffset+int64(rb.LastOffsetDelta) >= from && rb.NumRecords > 0 {
			return rb.FirstTimestamp
		}
	}
	return 0
}
