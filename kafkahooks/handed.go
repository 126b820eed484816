package kafkahooks

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"
)

// handedTable records, per partition, the first and last offsets that one
// kafka.Reader generation handed out and the highest offset the application
// committed through it. It is read on every fetch, so it is a copy-on-write
// map; the offsets are atomics.
type handedTable struct {
	mu sync.Mutex
	m  atomic.Pointer[map[tpKey]*tpMark]
	// hint is the partition of the last note: kafka-go hands out records
	// in runs per partition, so this usually spares the map lookup.
	hint atomic.Pointer[tpMark]
	// before holds, per partition, the highest offset handed out by the
	// generations before this one (immutable); empty until the first
	// checkpoint.
	before map[tpKey]int64
}

type tpKey struct {
	topic     string
	partition int
}

type tpMark struct {
	key       tpKey
	first     int64
	last      atomic.Int64
	committed atomic.Int64 // highest committed offset + 1; 0 if none
	// dropped is the lowest offset fetched but not handed to the
	// application (a checkpoint began under the fetch); MaxInt64 if none.
	dropped atomic.Int64
}

func newHandedTable(before map[tpKey]int64) *handedTable {
	h := &handedTable{before: before}
	m := map[tpKey]*tpMark{}
	h.m.Store(&m)
	return h
}

// next returns the table of the next generation.
func (h *handedTable) next() *handedTable {
	before := make(map[tpKey]int64, len(h.before))
	for k, v := range h.before {
		before[k] = v
	}
	for k, mk := range *h.m.Load() {
		if last, ok := before[k]; !ok || mk.last.Load() > last {
			before[k] = mk.last.Load()
		}
	}
	return newHandedTable(before)
}

func (h *handedTable) note(topic string, partition int, offset int64) {
	if mk := h.hint.Load(); mk != nil && mk.key.partition == partition && mk.key.topic == topic {
		mk.last.Store(offset)
		return
	}
	k := tpKey{topic, partition}
	if mk := (*h.m.Load())[k]; mk != nil {
		mk.last.Store(offset)
		h.hint.Store(mk)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.m.Load()
	if mk := old[k]; mk != nil {
		mk.last.Store(offset)
		h.hint.Store(mk)
		return
	}
	m := make(map[tpKey]*tpMark, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	mk := &tpMark{key: k, first: offset}
	mk.last.Store(offset)
	mk.dropped.Store(math.MaxInt64)
	m[k] = mk
	h.m.Store(&m)
	h.hint.Store(mk)
}

// drop notes that the record at offset, noted, was not handed to the
// application after all.
func (h *handedTable) drop(topic string, partition int, offset int64) {
	mk := (*h.m.Load())[tpKey{topic, partition}]
	if mk == nil {
		return
	}
	for {
		cur := mk.dropped.Load()
		if offset >= cur || mk.dropped.CompareAndSwap(cur, offset) {
			return
		}
	}
}

// current returns the messages to commit: all of them, except those that
// may have been handed out before the last checkpoint (their partition was
// handed out up to at least their offset before it) and whose commit would
// not move the partition forward from what this generation handed out and
// committed.
func (h *handedTable) current(msgs []kafka.Message) []kafka.Message {
	if len(h.before) == 0 {
		return msgs // no checkpoint yet: kafka-go's behaviour
	}
	m := *h.m.Load()
	ok := func(msg *kafka.Message) bool {
		k := tpKey{msg.Topic, msg.Partition}
		if last, seen := h.before[k]; !seen || msg.Offset > last {
			return true
		}
		mk := m[k]
		return mk != nil && msg.Offset >= mk.first && msg.Offset+1 > mk.committed.Load()
	}
	for i := range msgs {
		if !ok(&msgs[i]) {
			keep := append([]kafka.Message(nil), msgs[:i]...)
			for j := i + 1; j < len(msgs); j++ {
				if ok(&msgs[j]) {
					keep = append(keep, msgs[j])
				}
			}
			return keep
		}
	}
	return msgs
}

// uncommitted returns the messages whose commit would move their
// partition past what this generation committed.
func (h *handedTable) uncommitted(msgs []kafka.Message) []kafka.Message {
	m := *h.m.Load()
	var keep []kafka.Message
	for i := range msgs {
		if mk := m[tpKey{msgs[i].Topic, msgs[i].Partition}]; mk == nil || msgs[i].Offset+1 > mk.committed.Load() {
			keep = append(keep, msgs[i])
		}
	}
	return keep
}

func (h *handedTable) committed(msgs []kafka.Message) {
	m := *h.m.Load()
	for i := range msgs {
		mk := m[tpKey{msgs[i].Topic, msgs[i].Partition}]
		if mk == nil {
			continue
		}
		for {
			cur := mk.committed.Load()
			if msgs[i].Offset+1 <= cur || mk.committed.CompareAndSwap(cur, msgs[i].Offset+1) {
				break
			}
		}
	}
}

// inApp returns how many records this generation handed out that are not
// committed, nor in waiting (the highest offset per partition that a
// CommitMessages call waiting at the gate commits): records the application
// may still be processing. It is an upper bound: a record handed out but
// processed and not committed yet counts too.
func (h *handedTable) inApp(waiting map[tpKey]int64) int64 {
	var n int64
	for k, mk := range *h.m.Load() {
		from := max(mk.first, mk.committed.Load())
		if w, ok := waiting[k]; ok {
			from = max(from, w+1)
		}
		// Nothing after a dropped record was handed out: the checkpoint
		// had begun.
		if last := min(mk.last.Load(), mk.dropped.Load()-1); last >= from {
			n += last - from + 1
		}
	}
	return n
}

// settled returns, per partition, the offset after the last record handed
// out or committed: what inHand counts from.
func (h *handedTable) settled() map[tpKey]int64 {
	m := *h.m.Load()
	s := make(map[tpKey]int64, len(m))
	for k, mk := range m {
		s[k] = max(mk.last.Load()+1, mk.committed.Load())
	}
	return s
}

// inHand returns how many records handed out from the offsets of base on
// (a settled result; nil: from the first) are not committed.
func (h *handedTable) inHand(base *map[tpKey]int64) int64 {
	var n int64
	for k, mk := range *h.m.Load() {
		from := max(mk.first, mk.committed.Load())
		if base != nil {
			if b, ok := (*base)[k]; ok {
				from = max(from, b)
			}
		}
		if last := min(mk.last.Load(), mk.dropped.Load()-1); last >= from {
			n += last - from + 1
		}
	}
	return n
}
