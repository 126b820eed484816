package kafkahooks

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// The formats of kafka-go's (v0.4.51) log calls that frame a consumer group
// generation: the heartbeat's goroutine logs heartbeatStoppedFormat when the
// generation ends (a rebalance, a lost coordinator, Close), before the
// generation's commit loop stops; the Reader logs subscribedFormat once it
// has started the next generation's partition readers, after which records
// of the older generation are no longer handed out.
const (
	heartbeatStoppedFormat = "stopped heartbeat for group %s\n"
	subscribedFormat       = "subscribed to topics and partitions: %+v"
)

// groupLog is the ReaderConfig.Logger of a group kafka.Reader: it sees a
// generation end and the next begin (rebalanceHold), and passes every call
// on.
type groupLog struct {
	r     *Reader
	next  kafka.Logger
	inner atomic.Pointer[kafka.Reader] // set once kafka.NewReader returned
}

func (l *groupLog) Printf(format string, args ...any) {
	switch format {
	case heartbeatStoppedFormat:
		l.r.holdForRebalance(l.inner.Load())
	case subscribedFormat:
		l.r.endHold(l.inner.Load())
	}
	if l.next != nil {
		l.next.Printf(format, args...)
	}
}

// rebalanceHold keeps FetchMessage from handing out records between the end
// of a group generation and the start of the next.
type rebalanceHold struct {
	done chan struct{}
	once sync.Once
}

func (h *rebalanceHold) release() { h.once.Do(func() { close(h.done) }) }

// holdSlack is how much longer than the rebalance timeout a hold may last
// when the next generation does not start: FetchMessage then returns what
// kafka-go has (its errors too) rather than wait for ever.
const holdSlack = 10 * time.Second

// holdForRebalance runs in kafka-go's heartbeat goroutine when a generation
// of inner ends, before the generation's commit loop stops. If inner is the
// Reader's current kafka.Reader and no checkpoint or Close is under way, it
// stops FetchMessage from handing out records until the next generation
// starts, and waits, up to WithCommitWait and at most half the rebalance
// timeout, for the application to commit the records it holds: those
// commits still go out with this generation, which the coordinator accepts
// while it waits for the members to rejoin, so that the partition's next
// owner, this member or another, starts after them. Committed through the
// next generation instead, they would land after that owner read the older
// offset, and it would process them again.
func (r *Reader) holdForRebalance(inner *kafka.Reader) {
	s := r.state.Load()
	if inner == nil || s.r != inner || s.gate != nil || s.closed {
		return
	}
	h := &rebalanceHold{done: make(chan struct{})}
	if !r.hold.CompareAndSwap(nil, h) {
		return
	}
	timeout := r.rcfg.RebalanceTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second // kafka-go's default
	}
	wait := min(r.cfg.commitWait, timeout/2)
	time.AfterFunc(wait+timeout+holdSlack, func() { r.endHoldOf(h) })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	base := r.holdBase.Load()
	start := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var n int64
	for {
		if r.stash != nil {
			r.flush(ctx, s) // its error: the wait below ends on the deadline
		}
		if n = s.handed.inHand(base); n == 0 || r.state.Load() != s {
			break
		}
		select {
		case <-tick.C:
			continue
		case <-ctx.Done():
		case <-r.quit:
		}
		break
	}
	r.holds.Add(1)
	if n > 0 {
		r.holdMissed.Add(n)
		r.cfg.log.Debug("kafka reader: a rebalance came while the application held records it did not commit in time; the partitions' next owners may process them again",
			"records", n, "waited", time.Since(start))
	}
}

// endHold ends the hold of inner's rebalance, if any, once its next
// generation has started, and notes what the application had been handed
// so far: the next hold waits only for records handed out after it.
func (r *Reader) endHold(inner *kafka.Reader) {
	s := r.state.Load()
	if inner == nil || s.r != inner {
		return
	}
	base := s.handed.settled()
	r.holdBase.Store(&base)
	if h := r.hold.Load(); h != nil {
		r.endHoldOf(h)
	}
}

// endHoldOf releases h if it is the current hold.
func (r *Reader) endHoldOf(h *rebalanceHold) {
	r.hold.CompareAndSwap(h, nil)
	h.release()
}

// waitHold waits while a rebalance holds fetches, or until ctx ends.
func (r *Reader) waitHold(ctx context.Context) error {
	h := r.hold.Load()
	if h == nil {
		return nil
	}
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releaseHold ends the current hold, if any: a checkpoint or Close takes
// over.
func (r *Reader) releaseHold() {
	if h := r.hold.Load(); h != nil {
		r.endHoldOf(h)
	}
}
