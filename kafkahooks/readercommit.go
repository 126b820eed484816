package kafkahooks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrCommitsNotFlushed fails a before-checkpoint hook when a group Reader
// could not get its pending commits to the broker within the budget.
// WithUnflushedCommits lets the checkpoint go on instead.
var ErrCommitsNotFlushed = errors.New("kafkahooks: pending commits could not be flushed before the checkpoint")

// WithUnflushedCommits lets a group Reader's checkpoint go on when its
// pending commits cannot be flushed within the budget. They stay in memory
// (in the image) and are sent after the restore, by a copy whose new
// kafka.Reader was handed their partition from at most their offset and has
// not committed beyond it (the rule of Reader for commits of records fetched
// before a checkpoint); other copies drop them (stale_commits), so that none
// moves back an offset another member advanced meanwhile. Until then, or
// when dropped, the records are delivered again from the last commit that
// reached the broker. By default such a checkpoint fails with
// ErrCommitsNotFlushed.
func WithUnflushedCommits() ReaderOpt { return readerOpt(func(c *config) { c.unflushedOK = true }) }

// commitStash batches commits for a Reader with a CommitInterval. kafka-go's
// own interval commits are flushed once by its Close, with a retry that
// sleeps on an already canceled context: one COORDINATOR_LOAD_IN_PROGRESS
// loses them. So the Reader gives its kafka.Reader sync commits and batches
// them itself, and flushes with retries before a checkpoint.
type commitStash struct {
	mu      sync.Mutex
	offsets map[tpKey]int64 // highest offset to commit per partition
}

func (c *commitStash) add(msgs []kafka.Message) {
	c.mu.Lock()
	if c.offsets == nil {
		c.offsets = map[tpKey]int64{}
	}
	for i := range msgs {
		k := tpKey{msgs[i].Topic, msgs[i].Partition}
		if o, ok := c.offsets[k]; !ok || msgs[i].Offset > o {
			c.offsets[k] = msgs[i].Offset
		}
	}
	c.mu.Unlock()
}

// take returns the stashed commits as messages; done(ok) removes them if
// they reached the broker and no later commit was stashed meanwhile.
func (c *commitStash) take() ([]kafka.Message, func(ok bool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.offsets) == 0 {
		return nil, func(bool) {}
	}
	snap := make(map[tpKey]int64, len(c.offsets))
	msgs := make([]kafka.Message, 0, len(c.offsets))
	for k, o := range c.offsets {
		snap[k] = o
		msgs = append(msgs, kafka.Message{Topic: k.topic, Partition: k.partition, Offset: o})
	}
	return msgs, func(ok bool) {
		if !ok {
			return
		}
		c.mu.Lock()
		for k, o := range snap {
			if c.offsets[k] == o {
				delete(c.offsets, k)
			}
		}
		c.mu.Unlock()
	}
}

// remove removes the stashed offsets of all that are not in keep, unless a
// later offset was stashed meanwhile, and returns how many it removed.
func (c *commitStash) remove(all, keep []kafka.Message) int {
	kept := map[tpKey]bool{}
	for i := range keep {
		kept[tpKey{keep[i].Topic, keep[i].Partition}] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range all {
		k := tpKey{all[i].Topic, all[i].Partition}
		if !kept[k] && c.offsets[k] == all[i].Offset {
			delete(c.offsets, k)
			n++
		}
	}
	return n
}

func (c *commitStash) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.offsets)
}

// flush sends the stashed commits through inner. Each passes the
// handed-records check again (see Reader): commits stashed before a
// checkpoint and left unflushed (WithUnflushedCommits) are sent only by the
// copy whose kafka.Reader was handed their partition from at most that
// offset, so that no copy moves back an offset that another member advanced
// meanwhile. The others drop them (stale_commits).
func (r *Reader) flush(ctx context.Context, s *readerState) error {
	msgs, done := r.stash.take()
	if len(msgs) == 0 {
		return nil
	}
	if keep := s.handed.current(msgs); len(keep) < len(msgs) {
		stale := r.stash.remove(msgs, keep)
		r.staleCommits.Add(int64(stale))
		r.cfg.log.Debug("dropped stashed commits of records fetched before a checkpoint", "partitions", stale)
		msgs = keep
		if len(msgs) == 0 {
			done(true)
			return nil
		}
	}
	err := s.r.CommitMessages(ctx, msgs...)
	done(err == nil)
	if err == nil {
		s.handed.committed(msgs)
	}
	return err
}

// flushRetry flushes until it succeeds or ctx ends, with backoff.
func (r *Reader) flushRetry(ctx context.Context, s *readerState) error {
	backoff := 50 * time.Millisecond
	for {
		err := r.flush(ctx, s)
		if err == nil {
			return nil
		}
		r.cfg.log.Debug("flushing commits before a checkpoint", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %d partitions: %w", ErrCommitsNotFlushed, r.stash.size(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// intervalLoop commits the stash every CommitInterval, as kafka-go would.
func (r *Reader) intervalLoop(every time.Duration) {
	defer r.bg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-t.C:
		}
		s := r.state.Load()
		if s.gate != nil || s.closed || r.stash.size() == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		stop := context.AfterFunc(s.retired, cancel)
		if err := r.flush(ctx, s); err != nil && r.state.Load() == s {
			r.cfg.log.Warn("kafka reader could not commit offsets", "err", err)
		}
		stop()
		cancel()
	}
}

// pinTail commits, for every partition this generation handed out (or
// dropped) records from and on which the group has no committed offset, the
// first offset it handed out: where LastOffset had resolved to. Without it
// the rejoin after the checkpoint resolves LastOffset again, to the new end,
// and skips what was prefetched or produced meanwhile.
func (r *Reader) pinTail(ctx context.Context, s *readerState) (int, error) {
	marks := *s.handed.m.Load()
	if len(marks) == 0 {
		return 0, nil
	}
	topics := map[string][]int{}
	for k, mk := range marks {
		if mk.committed.Load() == 0 {
			topics[k.topic] = append(topics[k.topic], k.partition)
		}
	}
	if len(topics) == 0 {
		return 0, nil
	}
	// With the Dialer's TLS and SASL, like the kafka.Reader's own: its
	// connections do TLS themselves (fetchCut.wrap).
	cl, release := r.client(r.conns.DialContext, r.currentClientID(), true)
	defer release()
	committed, err := r.fetchCommitted(ctx, cl, topics)
	if err != nil {
		return 0, err
	}
	var pin []kafka.Message
	for k, off := range committed {
		if mk := marks[k]; off == -1 && mk != nil { // none (not offsetUnknown)
			// Committing message offset o commits o+1.
			pin = append(pin, kafka.Message{Topic: k.topic, Partition: k.partition, Offset: mk.first - 1})
		}
	}
	if len(pin) == 0 {
		return 0, nil
	}
	if err := s.r.CommitMessages(ctx, pin...); err != nil {
		return 0, fmt.Errorf("committing the resolved start offsets: %w", err)
	}
	return len(pin), nil
}
