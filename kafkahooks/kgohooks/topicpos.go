package kgohooks

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// topicPositions keeps the positions of a direct consumer of whole topics
// (kgo.ConsumeTopics or ConsumeRegex without a group). kgo starts every
// partition of such a consumer at ConsumeStartOffset and has no option to
// start some elsewhere, so a client built after a checkpoint, or resumed
// after one, is moved with SetOffsets to the offset after the last record
// handed to the application, and no record below it is handed out again.
type topicPositions struct {
	start startOffset // kgo's start offset, when symbolic
	atEnd bool        // it names the end of the partition (AtEnd, Relative to it, AfterMilli)

	mu   sync.Mutex
	next map[tp]int64
	// moved holds the partitions the current kgo client was moved to next
	// for after its first records (only once: offsets have gaps in
	// compacted topics and around transactions).
	moved map[tp]bool
}

func newTopicPositions(start kgo.Offset) *topicPositions {
	p := &topicPositions{next: map[tp]int64{}, moved: map[tp]bool{}}
	if at, sym, err := classify(start); err == nil && at < 0 {
		p.start, p.atEnd = sym, sym.kind != "start"
	}
	return p
}

// filter drops the records a poll returned below the next offset of their
// partition (handed out before), moves the client once to next when its
// first records of a partition are not there, and notes the records it
// lets through.
func (p *topicPositions) filter(cl *kgo.Client, fs kgo.Fetches) kgo.Fetches {
	set := map[string]map[int32]kgo.EpochOffset{}
	p.mu.Lock()
	out := keepPartitions(fs, func(topic string, fp *kgo.FetchPartition) bool {
		k := tp{topic, fp.Partition}
		n, known := p.next[k]
		if known && len(fp.Records) > 0 {
			first := fp.Records[0].Offset
			i := 0
			for i < len(fp.Records) && fp.Records[i].Offset < n {
				i++
			}
			fp.Records = fp.Records[i:]
			if !p.moved[k] {
				// The client's first records of the partition: if kgo
				// started it elsewhere (at ConsumeStartOffset again),
				// move it to next; nothing of this poll past next is
				// handed out.
				past := len(fp.Records) > 0 && fp.Records[0].Offset > n
				if past || first < n {
					put(set, k, epochAt(n))
				}
				if past {
					fp.Records = nil
				}
				p.moved[k] = true
			}
		}
		if m := len(fp.Records); m > 0 {
			p.next[k] = fp.Records[m-1].Offset + 1
		}
		return len(fp.Records) > 0 || fp.Err != nil
	})
	p.mu.Unlock()
	if len(set) > 0 {
		cl.SetOffsets(set)
	}
	return out
}

// restart moves a kgo client that starts, or may have fetched past, the
// handed-out positions (a new client, or one whose buffer a checkpoint
// drained) to them: kgo moves only partitions it consumes already, so the
// moves are repeated for a few seconds, until each partition returned
// records.
func (p *topicPositions) restart(cl *kgo.Client) {
	p.mu.Lock()
	p.moved = map[tp]bool{}
	empty := len(p.next) == 0
	p.mu.Unlock()
	if empty {
		return
	}
	go func() {
		for _, d := range []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond,
			500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second} {
			select {
			case <-cl.Context().Done():
				return
			case <-time.After(d):
			}
			set := map[string]map[int32]kgo.EpochOffset{}
			p.mu.Lock()
			for k, n := range p.next {
				if !p.moved[k] {
					put(set, k, epochAt(n))
				}
			}
			p.mu.Unlock()
			if len(set) == 0 {
				return
			}
			cl.SetOffsets(set)
		}
	}()
}

// checkpoint completes the positions before a dump: the records kgo
// fetched and did not hand out are drained (the first one of a partition is
// where kgo was), and, when kgo's start offset names the end of the
// partition, every other partition of the topics is at its end now, so that
// the next client does not resolve it again past the records produced
// meanwhile. topics are the topics consumed (for ConsumeRegex, those with
// handed records).
func (p *topicPositions) checkpoint(ctx context.Context, cl *kgo.Client, topics []string, readCommitted bool) error {
	drained := cl.PollRecords(nil, -1) // a nil context drains what is buffered, without waiting
	p.mu.Lock()
	drained.EachPartition(func(f kgo.FetchTopicPartition) {
		k := tp{f.Topic, f.Partition}
		if _, ok := p.next[k]; !ok && len(f.Records) > 0 {
			p.next[k] = f.Records[0].Offset
		}
	})
	for k := range p.next {
		if !slices.Contains(topics, k.topic) {
			topics = append(topics, k.topic)
		}
	}
	p.mu.Unlock()
	if !p.atEnd || len(topics) == 0 {
		return nil
	}
	ends, err := listEnds(ctx, kadm.NewClient(cl), readCommitted, topics...)
	if err != nil {
		return fmt.Errorf("list end offsets of %v: %w", topics, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ends.Each(func(o kadm.ListedOffset) {
		k := tp{o.Topic, o.Partition}
		if _, ok := p.next[k]; !ok && o.Err == nil && o.Offset >= 0 {
			p.next[k] = o.Offset
		}
	})
	return nil
}

func (p *topicPositions) report() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return nextReport(p.next)
}
