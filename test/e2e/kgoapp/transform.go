package main

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
)

// transformer is the consume-transform-produce mode (-transform-from): a
// kgohooks.GroupTransactSession copies every record of the input topic to
// the output topic, with a "src" header "partition/offset", in
// transactions of up to 20 records.
type transformer struct {
	s         *kgohooks.GroupTransactSession
	committed atomic.Int64
	aborted   atomic.Int64
}

func newTransformer(brokers []string, in, out, group, txnID, clientID string) (*transformer, error) {
	s, err := kgohooks.NewSession([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(in), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(out),
		kgo.RequireStableFetchOffsets(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond), kgo.SessionTimeout(6 * time.Second)})
	if err != nil {
		return nil, err
	}
	return &transformer{s: s}, nil
}

func (x *transformer) loop(ctx context.Context) {
	for ctx.Err() == nil {
		if err := x.s.Begin(ctx); err != nil {
			if ctx.Err() == nil {
				emit("txn-error", "op", "begin", "err", err.Error())
				time.Sleep(100 * time.Millisecond)
			}
			continue
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
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			src := strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
			x.s.Produce(context.Background(), &kgo.Record{Key: r.Key, Value: r.Value,
				Headers: []kgo.RecordHeader{{Key: "src", Value: []byte(src)}}}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(true)
				}
			})
		})
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
	emit("after", "kind", ev.Kind.String(), "gen", ev.Generation, "instance", ev.InstanceID, "reason", ev.Reason,
		"writer_client", x.s.ClientID(), "txn_id", x.s.TransactionalID())
}
