package kgohooks

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startOffset is a start offset of kgo.ConsumePartitions that names no
// record yet: the start or end of the partition (plus Relative), or the
// first record after a timestamp.
type startOffset struct {
	kind     string // "start", "end", "milli"
	relative int64
	milli    int64
}

// classify tells an exact offset (returned as at >= 0) from a symbolic one.
// kgo.Offset hides its fields; EpochOffset, MarshalJSON and comparisons with
// offsets built by kgo's own methods reveal them.
func classify(o kgo.Offset) (at int64, sym startOffset, err error) {
	eo := o.EpochOffset()
	var j struct {
		Relative int64
		Lookback string
	}
	if b, err := o.MarshalJSON(); err == nil {
		json.Unmarshal(b, &j)
	}
	switch {
	case j.Lookback != "":
		return 0, sym, fmt.Errorf("offset %v: LookbackOffset and RewindOffset are not supported for ConsumePartitions; use At, AtStart, AtEnd, Relative or AfterMilli", o)
	case o == o.AfterMilli(eo.Offset):
		return -1, startOffset{kind: "milli", milli: eo.Offset}, nil
	case eo.Offset >= 0:
		return eo.Offset + j.Relative, sym, nil
	case eo.Offset == -2:
		return -1, startOffset{kind: "start", relative: j.Relative}, nil
	case eo.Offset == -1:
		return -1, startOffset{kind: "end", relative: j.Relative}, nil
	}
	return 0, sym, fmt.Errorf("offset %v: AtCommitted is not supported for ConsumePartitions (there is no group)", o)
}

// positions keeps, for direct partitions (kgo.ConsumePartitions), the exact
// offset the next record handed to the application has: the resolved start
// offset until a record is handed out, then the last one's offset + 1. kgo
// is only ever given exact offsets, so a client built after a checkpoint
// continues exactly where the application stopped.
type positions struct {
	// readCommitted (kgo.FetchIsolationLevel(kgo.ReadCommitted())): the end
	// of a partition is its last stable offset, as kgo resolves AtEnd,
	// not its high watermark, which may be past records of open
	// transactions that will still be committed.
	readCommitted bool
	mu            sync.Mutex
	next          map[tp]int64
	pending       map[tp]startOffset // not resolved yet
}

func newPositions(parts map[string]map[int32]kgo.Offset) (*positions, error) {
	p := &positions{next: map[tp]int64{}, pending: map[tp]startOffset{}}
	return p, p.add(parts)
}

func (p *positions) add(parts map[string]map[int32]kgo.Offset) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t, ps := range parts {
		for part, o := range ps {
			at, sym, err := classify(o)
			if err != nil {
				return fmt.Errorf("kgohooks: partition %s/%d: %w", t, part, err)
			}
			k := tp{t, part}
			if at >= 0 {
				p.next[k] = at
				delete(p.pending, k)
			} else {
				p.pending[k] = sym
				delete(p.next, k)
			}
		}
	}
	return nil
}

func (p *positions) remove(parts map[string][]int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t, ps := range parts {
		for _, part := range ps {
			delete(p.next, tp{t, part})
			delete(p.pending, tp{t, part})
		}
	}
}

// exact returns the resolved partitions as kgo.ConsumePartitions wants them.
func (p *positions) exact() map[string]map[int32]kgo.Offset {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]map[int32]kgo.Offset{}
	for k, at := range p.next {
		put(m, k, kgo.NewOffset().At(at))
	}
	return m
}

func (p *positions) unresolved() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// handed notes the records of a poll.
func (p *positions) handed(fs kgo.Fetches) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs.EachPartition(func(f kgo.FetchTopicPartition) {
		if n := len(f.Records); n > 0 {
			k := tp{f.Topic, f.Partition}
			if _, ok := p.next[k]; ok {
				p.next[k] = f.Records[n-1].Offset + 1
			}
		}
	})
}

// resolve asks the broker for the exact offsets of the pending partitions
// and returns them; they are added to next, unless a record of the partition
// was handed out meanwhile (it cannot be: kgo consumes only exact ones).
func (p *positions) resolve(ctx context.Context, adm *kadm.Client) (map[string]map[int32]kgo.Offset, error) {
	p.mu.Lock()
	pending := maps.Clone(p.pending)
	p.mu.Unlock()
	if len(pending) == 0 {
		return nil, nil
	}
	resolved, err := resolveStarts(ctx, adm, p.readCommitted, pending)
	if err != nil {
		return nil, err
	}
	out := map[string]map[int32]kgo.Offset{}
	p.mu.Lock()
	for k, at := range resolved {
		if _, still := p.pending[k]; still {
			delete(p.pending, k)
			p.next[k] = at
			put(out, k, kgo.NewOffset().At(at))
		}
	}
	p.mu.Unlock()
	return out, nil
}

// resolveStarts asks the broker for the exact offsets that the symbolic start
// offsets of the partitions in pending name now, as kgo would resolve them:
// AtEnd is the high watermark, or the last stable offset with
// readCommitted; every offset is bounded by the partition's start and end.
func resolveStarts(ctx context.Context, adm *kadm.Client, readCommitted bool, pending map[tp]startOffset) (map[tp]int64, error) {
	var topics []string
	seen := map[string]bool{}
	for k := range pending {
		if !seen[k.topic] {
			seen[k.topic] = true
			topics = append(topics, k.topic)
		}
	}
	starts, err := listed(adm.ListStartOffsets(ctx, topics...))
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := listEnds(ctx, adm, readCommitted, topics...)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	milli := map[int64]kadm.ListedOffsets{}
	resolved := map[tp]int64{}
	for k, sym := range pending {
		s, ok1 := starts.Lookup(k.topic, k.partition)
		e, ok2 := ends.Lookup(k.topic, k.partition)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("partition %s/%d: not in the broker's offsets", k.topic, k.partition)
		}
		var at int64
		switch sym.kind {
		case "start":
			at = s.Offset + sym.relative
		case "end":
			at = e.Offset + sym.relative
		case "milli":
			lo, ok := milli[sym.milli]
			if !ok {
				lo, err = listed(adm.ListOffsetsAfterMilli(ctx, sym.milli, topics...))
				if err != nil {
					return nil, fmt.Errorf("list offsets after %d ms: %w", sym.milli, err)
				}
				milli[sym.milli] = lo
			}
			at = e.Offset
			if l, ok := lo.Lookup(k.topic, k.partition); ok && l.Offset >= 0 {
				at = l.Offset
			}
		}
		resolved[k] = min(max(at, s.Offset), e.Offset)
	}
	return resolved, nil
}

func (p *positions) report() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return nextReport(p.next)
}
