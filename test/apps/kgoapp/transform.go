package main

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/test/apps/appkit"
)

// transformer is the consume-transform-produce mode (-transform-from): a
// kgohooks.GroupTransactSession copies every record of the input topic to
// the output topic, with a "src" header "partition/offset", in
// transactions of up to 20 records.
//
// With -hold-txn, the loop leaves a transaction with records open across the
// first checkpoint (it waits for the after-restore hook before ending it),
// so that kgohooks' OpenTxnPolicy ends it. A fenced loop (IsFenced, after a
// restore with -keep-txn-id) emits "fenced" and stops.
type transformer struct {
	s         *kgohooks.GroupTransactSession
	committed atomic.Int64
	aborted   atomic.Int64

	holdTxn bool
	hold    atomic.Bool   // the before hook asked for a held transaction
	held    chan struct{} // closed by the loop once it holds one
	release chan struct{} // closed by the after hook
	once    sync.Once
}

func newTransformer(brokers []string, in, out, group, txnID, clientID string, holdTxn, keepTxnID bool) (*transformer, error) {
	var opts []kgohooks.Opt
	if keepTxnID {
		opts = append(opts, kgohooks.WithTxnIDPolicy(kgohooks.KeepTxnID))
	}
	s, err := kgohooks.NewSession(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(in), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(out),
		kgo.RequireStableFetchOffsets(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond), kgo.SessionTimeout(6 * time.Second), kgo.WithLogger(kgoLog{}), isolation()}, secOpts...), opts...)
	if err != nil {
		return nil, err
	}
	return &transformer{s: s, holdTxn: holdTxn, held: make(chan struct{}), release: make(chan struct{})}, nil
}

// before is registered after the session, so it runs before the session's
// hook, while the gate is still open: it waits until the loop holds a
// transaction with records.
func (x *transformer) before(ctx context.Context) error {
	if !x.holdTxn {
		return nil
	}
	x.hold.Store(true)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	select {
	case <-x.held:
	case <-wctx.Done():
		emit("hold-error", "err", "no transaction with records within 5 s")
	}
	return nil
}

func (x *transformer) loop(ctx context.Context) {
	for ctx.Err() == nil {
		if err := x.s.Begin(ctx); err != nil {
			// A producer fenced while it had no transaction open (its
			// last End had nothing to send) learns it here: kgo keeps
			// the fencing error and every Begin returns it, so the loop
			// stops as it does when End is fenced.
			if kgohooks.IsFenced(err) {
				emit("fenced", "op", "begin", "err", err.Error(), "records", 0, "txn_id", x.s.TransactionalID())
				return
			}
			if ctx.Err() == nil {
				emit("txn-error", "op", "begin", "err", err.Error())
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		if x.hold.Load() {
			time.Sleep(200 * time.Millisecond) // a bigger batch to hold
		}
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := x.s.PollRecords(pctx, 20)
		cancel()
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				emit("fetch-error", "err", err.Error())
			}
		})
		var failed atomic.Bool
		var fenced atomic.Value
		n := 0
		var srcs []string
		fs.EachRecord(func(r *kgo.Record) {
			n++
			src := strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
			srcs = append(srcs, src)
			x.s.Produce(context.Background(), &kgo.Record{Key: r.Key, Value: r.Value,
				Headers: []kgo.RecordHeader{{Key: "src", Value: []byte(src)}}}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(true)
					if kgohooks.IsFenced(err) {
						fenced.Store(err.Error())
					}
				}
			})
		})
		if n >= 5 && x.hold.Load() { // a batch, not a lone record
			x.once.Do(func() {
				emit("held", "records", n, "srcs", srcs, "txn_id", x.s.TransactionalID())
				close(x.held)
				<-x.release
			})
		}
		fctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ferr := x.s.Flush(fctx)
		cancel()
		try := kgo.TryCommit
		if ferr != nil || failed.Load() {
			try = kgo.TryAbort
		}
		ectx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		committed, err := x.s.End(ectx, try)
		cancel()
		if f, _ := fenced.Load().(string); kgohooks.IsFenced(err) || f != "" {
			if f == "" {
				f = err.Error()
			}
			emit("fenced", "err", f, "records", n, "txn_id", x.s.TransactionalID())
			return
		}
		switch {
		case err != nil:
			emit("txn-error", "op", "end", "err", err.Error(), "records", n)
		case committed && n > 0:
			x.committed.Add(int64(n))
			emit("txn", "committed", true, "records", n, "txn_id", x.s.TransactionalID())
		case !committed && n > 0:
			x.aborted.Add(int64(n))
			emit("txn", "committed", false, "records", n, "txn_id", x.s.TransactionalID())
		}
	}
}

// after is the transformer's part of the last after-restore hook.
func (x *transformer) after(ev notify.Event) {
	if x.hold.Swap(false) {
		close(x.release)
	}
	appkit.EmitAfter(ev, "writer_client", x.s.ClientID(), "txn_id", x.s.TransactionalID())
}

// kgoLog sends kgo's own log to slog (ev "log" events), for a failing test
// to show: warnings and errors, and with -log-level debug also kgo's info
// (every transaction, join and rebalance).
type kgoLog struct{}

func (kgoLog) Level() kgo.LogLevel {
	if slog.Default().Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (kgoLog) Log(level kgo.LogLevel, msg string, kv ...any) {
	l := slog.LevelInfo
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	}
	slog.Log(context.Background(), l, "kgo: "+msg, kv...)
}
