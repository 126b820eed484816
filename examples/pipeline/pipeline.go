package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/examples/order"
	"github.com/kcr-dev/kcr/notify"
)

// Fetcher and Producer are the parts of kafkahooks' Reader and Writer the
// pipeline uses; tests may pass plain kafka-go clients.
type Fetcher interface {
	FetchMessage(context.Context) (kafka.Message, error)
	CommitMessages(context.Context, ...kafka.Message) error
}

type Producer interface {
	WriteMessages(context.Context, ...kafka.Message) error
}

// Result is the value of a record in the results topic. examples/verify
// reads order, seq, gen and instance.
type Result struct {
	Order      string `json:"order"`
	N          int64  `json:"n"`
	Seq        uint64 `json:"seq"`
	Generation uint64 `json:"gen"`
	Instance   string `json:"instance"`
	PID        int    `json:"pid"`
	Score      uint64 `json:"score"`
}

// Pipeline consumes orders, looks each one up in its warm cache and produces
// one numbered result per order, committing the orders after their results
// were acknowledged (at-least-once).
type Pipeline struct {
	In    Fetcher
	Out   Producer
	Cache *Cache
	Emit  func(ev string, kv ...any)
	Log   *slog.Logger
	// Batch is the most orders taken into one produce and commit.
	Batch int
	// OrderCost is the time spent on each order (zero: none), for a
	// pipeline of known capacity.
	OrderCost time.Duration
	// Registry is the one the pipeline's hook is registered with: its
	// identity is that of the results until the first restore. Default:
	// notify.Default.
	Registry *notify.Registry

	seq       atomic.Uint64 // results produced, in the image too: clones continue it
	processed atomic.Int64
	gen       atomic.Uint64
	instance  atomic.Pointer[string]
	after     atomic.Pointer[string] // "start", "restore" or "resume": the next first-result event says which
	firstDone atomic.Bool

	mu          sync.Mutex
	cond        *sync.Cond
	paused      bool
	busy        bool               // between taking a batch and committing it
	cancelFetch context.CancelFunc // ends a fetch that waits for orders
}

func (p *Pipeline) init() {
	p.cond = sync.NewCond(&p.mu)
	if p.Batch <= 0 {
		p.Batch = 64
	}
	if p.Emit == nil {
		p.Emit = func(string, ...any) {}
	}
	if p.Log == nil {
		p.Log = slog.Default()
	}
	if p.Registry == nil {
		p.Registry = notify.Default
	}
	// The cold process has an identity too: results carry it until a
	// restore gives the instance a new one.
	gen, id := p.Registry.Identity()
	start := "start"
	p.gen.Store(gen)
	p.instance.Store(&id)
	p.after.Store(&start)
}

// Processed is the number of orders processed so far.
func (p *Pipeline) Processed() int64 { return p.processed.Load() }

// Run processes orders until ctx ends or the input is closed.
func (p *Pipeline) Run(ctx context.Context) error {
	for {
		batch, err := p.take(ctx)
		if err != nil {
			p.idle()
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			if errors.Is(err, context.Canceled) {
				continue // a drain ended the fetch: nothing was taken
			}
			p.Log.Warn("fetch failed", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		err = p.handle(ctx, batch)
		p.idle()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// take waits while the pipeline is paused, then fetches one order (waiting
// for it) and whatever else is there at once, up to Batch.
func (p *Pipeline) take(ctx context.Context) ([]kafka.Message, error) {
	p.mu.Lock()
	for p.paused {
		p.cond.Wait()
	}
	fctx, cancel := context.WithCancel(ctx)
	p.cancelFetch = cancel
	p.busy = true
	p.mu.Unlock()
	defer cancel()

	m, err := p.In.FetchMessage(fctx)
	if err != nil {
		return nil, err
	}
	batch := []kafka.Message{m}
	for len(batch) < p.Batch {
		qctx, qcancel := context.WithTimeout(fctx, time.Millisecond)
		m, err := p.In.FetchMessage(qctx)
		qcancel()
		if err != nil {
			break
		}
		batch = append(batch, m)
	}
	return batch, nil
}

func (p *Pipeline) idle() {
	p.mu.Lock()
	p.busy = false
	p.cancelFetch = nil
	p.cond.Broadcast()
	p.mu.Unlock()
}

// handle produces the batch's results and commits its orders, retrying
// until both succeed or ctx ends: an order is never skipped.
func (p *Pipeline) handle(ctx context.Context, batch []kafka.Message) error {
	if p.OrderCost > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(len(batch)) * p.OrderCost):
		}
	}
	out := make([]kafka.Message, len(batch))
	inst := *p.instance.Load()
	for i, m := range batch {
		var o order.Order
		if err := json.Unmarshal(m.Value, &o); err != nil || o.ID == "" {
			o.ID = string(m.Key)
		}
		r := Result{
			Order: o.ID, N: o.N, Seq: p.seq.Add(1), Generation: p.gen.Load(),
			Instance: inst, PID: os.Getpid(), Score: p.Cache.Score(o.N),
		}
		v, _ := json.Marshal(r)
		out[i] = kafka.Message{Key: []byte(o.ID), Value: v, Headers: []kafka.Header{
			{Key: "seq", Value: []byte(strconv.FormatUint(r.Seq, 10))},
		}}
	}
	if err := retry(ctx, p.Log, "produce results", func() error { return p.Out.WriteMessages(ctx, out...) }); err != nil {
		return err
	}
	if p.firstDone.CompareAndSwap(false, true) {
		p.Emit("first-result", "after", *p.after.Load(), "order", string(out[0].Key))
	}
	if err := retry(ctx, p.Log, "commit orders", func() error { return p.In.CommitMessages(ctx, batch...) }); err != nil {
		return err
	}
	p.processed.Add(int64(len(batch)))
	return nil
}

func retry(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		log.Warn(what+" failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Drain is the before-checkpoint hook of -drain: it stops taking orders and
// waits until the batch in hand has its results acknowledged and its orders
// committed, so that no order gets a second result after the restore.
func (p *Pipeline) Drain(ctx context.Context) error {
	p.mu.Lock()
	p.paused = true
	if p.cancelFetch != nil {
		p.cancelFetch()
	}
	done := make(chan struct{})
	go func() {
		for p.busy {
			p.cond.Wait()
		}
		p.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the batch in hand was not finished in time: %w", ctx.Err())
	}
}

// Continue is the after-restore hook: it takes the new identity, logs the
// event and lets the pipeline take orders again.
func (p *Pipeline) Continue(_ context.Context, ev notify.Event) error {
	if ev.Kind == notify.Restore {
		p.gen.Store(ev.Generation)
		id := ev.InstanceID
		p.instance.Store(&id)
	}
	kind := ev.Kind.String()
	p.after.Store(&kind)
	p.firstDone.Store(false)
	p.Emit("after-restore", "kind", kind, "generation", ev.Generation, "instance", ev.InstanceID,
		"reason", ev.Reason, "self_detected", ev.SelfDetected)
	p.mu.Lock()
	p.paused = false
	p.cond.Broadcast()
	p.mu.Unlock()
	return nil
}
