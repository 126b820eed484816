package kafkawake

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
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
	// Oldest is since when the oldest record past the commits is known
	// to wait: its timestamp (its batch's, which may be a little older),
	// clamped to when this watcher first saw it in the log; zero without
	// lag. So a timestamp from a producer's past (a replay, a mirror that
	// keeps timestamps) counts only from when the record was seen, and
	// one from its future is ignored.
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
	now := time.Now()
	w.arr.mu.Lock()
	defer w.arr.mu.Unlock()
	w.arr.seenNow = map[string]bool{}
	for leader, parts := range v.byLeader {
		req, byKey := fetchRequest(parts, 0)
		resp, err := req.RequestWith(ctx, w.cl.Broker(int(leader)))
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			return Backlog{}, fmt.Errorf("fetch from broker %d: %w", leader, err)
		}
		w.arr.add(&b, v, resp, byKey, now)
	}
	w.arr.forget() // a reading cut short by an error forgets nothing
	return b, nil
}

// arrivals remembers, per partition with lag, when the watcher saw its
// log end grow: when a record was first seen, whatever its timestamp.
type arrivals struct {
	mu      sync.Mutex
	parts   map[string][]sample // oldest first; only those past the commits
	seenNow map[string]bool     // partitions with lag at this reading
}

type sample struct {
	end int64
	at  time.Time
}

// arrivalsMax bounds the samples kept per partition: past it the oldest
// go, which makes the records they covered look younger, never older.
const arrivalsMax = 256

// since records that partition k's log ended at end at now, and returns
// when the record at from was first seen in it; a.mu is held.
func (a *arrivals) since(k string, from, end int64, now time.Time) time.Time {
	if a.parts == nil {
		a.parts = map[string][]sample{}
	}
	s := a.parts[k]
	if n := len(s); n > 0 && end < s[n-1].end {
		s = nil // the log was cut or created again: seen from now
	}
	if n := len(s); n == 0 || end > s[n-1].end {
		s = append(s, sample{end, now})
	}
	i := 0
	for i < len(s)-1 && s[i].end <= from {
		i++
	}
	s = s[max(i, len(s)-arrivalsMax):]
	a.parts[k] = s
	a.seenNow[k] = true
	return s[0].at
}

// forget drops the partitions without lag at this reading; a.mu is held.
func (a *arrivals) forget() {
	for k := range a.parts {
		if !a.seenNow[k] {
			delete(a.parts, k)
		}
	}
}

// add adds the lag and oldest record of one leader's answer to b; a.mu is
// held.
func (a *arrivals) add(b *Backlog, v *view, resp *kmsg.FetchResponse, byKey map[string]*part, now time.Time) {
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
			t := a.since(partKey(topic, rp.Partition), pt.from, end, now)
			if ts := firstTimestamp(rp.RecordBatches, pt.from); ts > 0 {
				if stamp := time.UnixMilli(ts); stamp.After(t) && !stamp.After(now) {
					t = stamp
				}
			}
			if b.Oldest.IsZero() || t.Before(b.Oldest) {
				b.Oldest = t
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
