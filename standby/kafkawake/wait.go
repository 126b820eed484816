package kafkawake

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// Wait returns nil as soon as the group has work (see Pending), or
// ctx.Err() when ctx ends first. Errors never end it: they are logged once
// per outage, and the watcher reads the group again after a short wait.
func (w *Watcher) Wait(ctx context.Context) error {
	stop := w.reportRequests()
	defer stop()
	var out outage
	var retry time.Duration
	for {
		work, topics, err := w.round(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errMoved):
			continue
		case err != nil:
			if out.rounds == 0 {
				out.since = time.Now()
				w.log.Warn("standby: kafka wake: broker request failed; watching on, no wake on errors", "group", w.cfg.Group, "err", err)
			}
			retry = nextRetry(retry, out.last, err)
			out.rounds++
			out.last = err
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(retry):
			}
			continue
		}
		if out.rounds > 0 {
			// What failed last tells why a wake came late after the
			// broker was back (a coordinator loading, a stale leader).
			w.log.Info("standby: kafka wake: the brokers answer again", "group", w.cfg.Group,
				"failed_rounds", out.rounds, "failing_ms", msSince(out.since), "last_err", out.last)
		}
		out, retry = outage{}, 0
		if work > 0 {
			w.log.Info("standby: kafka work", "group", w.cfg.Group, "records", work, "topics", topics)
			return nil
		}
	}
}

// outage is a run of failed rounds.
type outage struct {
	rounds int
	since  time.Time
	last   error
}

// nextRetry is the wait after a round failed with err, the one before
// with prev (nil: the first failure of an outage), after a wait of retry:
// retryMin, doubled each time up to retryMax. A failure of another kind
// starts over from retryMin: when the broker takes connections again,
// what fails then (a connection it cut as it stopped, a coordinator still
// loading) passes within moments.
func nextRetry(retry time.Duration, prev, err error) time.Duration {
	if prev == nil || dialFailed(prev) != dialFailed(err) {
		return retryMin
	}
	return min(2*retry, retryMax)
}

// dialFailed reports whether err is a failure to connect to a broker.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// round reads the group (setup), then fetches from every leader until one
// finds work, one fails, or the reading is old (refreshEvery, or incompleteEvery
// when a topic or leader was missing): then it returns no work and no
// error, and Wait reads the group again.
func (w *Watcher) round(ctx context.Context) (int64, []string, error) {
	v, err := w.setup(ctx)
	if err != nil {
		return 0, nil, err
	}
	until := time.Now().Add(refreshEvery)
	if v.incomplete {
		until = time.Now().Add(incompleteEvery)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		work int64
		err  error
	}
	results := make(chan result, len(v.byLeader))
	for leader, parts := range v.byLeader {
		go func() {
			n, err := w.follow(rctx, v, leader, parts, until)
			results <- result{n, err}
		}()
	}
	var work int64
	for range v.byLeader {
		r := <-results
		if r.err != nil && rctx.Err() == nil {
			err = r.err
		}
		work += r.work
		if r.err != nil || r.work > 0 {
			cancel() // the others' fetches: the round is over
		}
	}
	if work > 0 {
		return work, v.topics, nil
	}
	return 0, v.topics, err
}

// follow fetches from one leader until it finds work, fails, or until
// has passed. Long-polling, the broker answers when a record lands;
// polling, it sleeps Poll between caught-up fetches.
func (w *Watcher) follow(ctx context.Context, v *view, leader int32, parts []*part, until time.Time) (int64, error) {
	wait := longWait
	if w.cfg.Poll > 0 {
		wait = 0
	}
	for time.Now().Before(until) {
		before := positions(parts)
		n, caughtUp, err := w.fetch(ctx, v, leader, parts, wait)
		if err != nil || n > 0 {
			return n, err
		}
		pause := time.Duration(0)
		switch {
		case caughtUp && w.cfg.Poll > 0:
			pause = w.cfg.Poll
		case !caughtUp && positions(parts) == before:
			// Behind, and nothing read: a batch too big for its place in
			// the response. Another partition goes first next time (the
			// broker always returns the first one's batch whole).
			rotate(parts)
			pause = retryMin
		}
		if pause > 0 {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(pause):
			}
		}
	}
	return 0, nil
}

// positions is the sum of the positions of parts: it moves when any does.
func positions(parts []*part) int64 {
	var sum int64
	for _, pt := range parts {
		sum += pt.from
	}
	return sum
}

func rotate(parts []*part) {
	if len(parts) > 1 {
		first := parts[0]
		copy(parts, parts[1:])
		parts[len(parts)-1] = first
	}
}

// reportRequests tells Config.Requests the requests written, every second
// until the returned stop is called, and once more then.
func (w *Watcher) reportRequests() (stop func()) { return reportRequests(&w.reqs, w.cfg.Requests) }

// reportRequests tells fn the requests counted in reqs, every second until
// the returned stop is called, and once more then (nil fn: nothing).
func reportRequests(reqs *atomic.Int64, fn func(int)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	last := reqs.Load()
	report := func() {
		n := reqs.Load()
		fn(int(n - last))
		last = n
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				report()
				return
			case <-tick.C:
				report()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
