package main

import (
	"context"
	"errors"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/test/apps/appkit"
)

// runShare is the share-group consumer mode (-share): a kgohooks
// ShareConsumer polls at most maxRecs records at a time (kgo.ShareMaxRecords,
// strict), spends -proc-delay on each, logs it ("proc" with its delivery
// count "dc"; "polled" for each poll: its records and time), and leaves its acknowledgement to the next poll (kgo's
// auto-accept). heldWait is kgohooks.WithHeldWait (0: its default): a
// checkpoint that catches a batch half done releases the rest after it.
func runShare(brokers []string, topic, group, clientID string, maxRecs int, heldWait time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID), kgo.ShareGroup(group), kgo.ConsumeTopics(topic),
		kgo.ShareMaxRecords(int32(maxRecs)), kgo.ShareMaxRecordsStrict(), kgo.FetchMaxWait(500 * time.Millisecond)}
	var hopts []kgohooks.Opt
	if heldWait > 0 {
		hopts = append(hopts, kgohooks.WithHeldWait(heldWait))
	}
	c, err := kgohooks.NewShareConsumer(append(opts, secOpts...), hopts...)
	if err != nil {
		return err
	}
	notify.Register("kgoapp", notify.Func(nil, func(_ context.Context, ev notify.Event) error {
		appkit.EmitAfter(ev, "reader_client", c.ClientID())
		return nil
	}))
	srv, err := notify.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	emit("ready", "listen", "", "socket", srv.Path())
	var procd int64
	for ctx.Err() == nil {
		t0 := time.Now()
		fs := c.PollFetches(ctx)
		emit("polled", "records", fs.NumRecords(), "ms", time.Since(t0).Milliseconds())
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.Canceled) {
				emit("fetch-error", "err", err.Error())
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			time.Sleep(procDelay)
			procd++
			emit("proc", "p", r.Partition, "from", r.Offset, "to", r.Offset, "dc", r.DeliveryCount())
		})
	}
	c.Close()
	emit("exit", "processed", procd)
	return nil
}
