package kafkawake

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// A ShareWatcher on kfake: no offsets before a member fetched; a member
// accepts all 3 records, so no backlog; Wait goes on until a record lands,
// then returns, with its requests counted; a topic filter that names a
// topic without offsets says so; Wait ends with its context.
func TestShareWatcher(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "sw"), kfake.SeedTopics(1, "other"))
	c.SetGroupConfigs("sg", map[string]string{"share.auto.offset.reset": "earliest"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var reqs atomic.Int64
	w, err := NewShare(ctx, ShareConfig{Brokers: addrs, Group: "sg", Poll: 20 * time.Millisecond,
		Requests: func(n int) { reqs.Add(int64(n)) }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, _, err := w.Pending(ctx); !errors.Is(err, ErrNoShareOffsets) {
		t.Fatalf("before any member: %v, want ErrNoShareOffsets", err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("sw"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(n int) {
		for range n {
			if err := prod.ProduceSync(ctx, &kgo.Record{}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(3)
	m, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ShareGroup("sg"), kgo.ConsumeTopics("sw"))
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 3 && ctx.Err() == nil; {
		m.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got++; r.Ack(kgo.AckAccept) })
	}
	if err := m.FlushAcks(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if n, _, err := w.Pending(ctx); err != nil || n != 0 {
		t.Fatalf("every record accepted: backlog %d, %v; want 0", n, err)
	}

	woke := make(chan error, 1)
	go func() { woke <- w.Wait(ctx) }()
	select {
	case err := <-woke:
		t.Fatalf("Wait returned %v without a backlog", err)
	case <-time.After(300 * time.Millisecond):
	}
	produce(1)
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return after a record landed")
	}
	if n, topics, err := w.Pending(ctx); err != nil || n != 1 || len(topics) != 1 || topics[0] != "sw" {
		t.Fatalf("backlog %d on %v, %v; want 1 on [sw]", n, topics, err)
	}
	if reqs.Load() < 2 {
		t.Errorf("%d requests reported for a Wait of several readings", reqs.Load())
	}

	wo, err := NewShare(ctx, ShareConfig{Brokers: addrs, Group: "sg", Topics: []string{"sw", "other"}})
	if err != nil {
		t.Fatal(err)
	}
	defer wo.Close()
	if _, _, err := wo.Pending(ctx); !errors.Is(err, ErrNoShareOffsets) {
		t.Fatalf("a watched topic the group never fetched: %v, want ErrNoShareOffsets", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	if err := wo.Wait(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait without a backlog: %v, want its context's end", err)
	}
}
