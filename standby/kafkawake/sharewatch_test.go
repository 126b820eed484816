package kafkawake

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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

// A partition where the group has acknowledged nothing has no lag at a real
// broker (start offset and lag -1, which kfake is made to answer here): the
// records past the end offset first seen there count, and that base is
// carried by the watcher's state. In a group that does not start at the
// earliest offset (the broker may skip those records), they wake (wait's
// reading) but do not keep the service awake (Pending settles the base).
func TestShareWatcherUnacknowledged(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "sw"))
	c.SetGroupConfigs("sg", map[string]string{"share.auto.offset.reset": "earliest"})
	c.ControlKey(int16(kmsg.DescribeShareGroupOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.DescribeShareGroupOffsetsRequest)
		resp := req.ResponseKind().(*kmsg.DescribeShareGroupOffsetsResponse)
		g := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
		g.GroupID = "sg"
		rt := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopic()
		rt.Topic = "sw"
		for p := range int32(2) {
			rp := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopicPartition()
			rp.Partition, rp.StartOffset, rp.Lag = p, -1, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		g.Topics = append(g.Topics, rt)
		resp.Groups = append(resp.Groups, g)
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	to := func(p int32, n int) {
		for range n {
			if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "sw", Partition: p}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	to(0, 3) // before the watcher first looks: not counted
	w, err := NewShare(ctx, ShareConfig{Brokers: addrs, Group: "sg"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if n, _, err := w.Pending(ctx); err != nil || n != 0 {
		t.Fatalf("first look: backlog %d, %v; want 0", n, err)
	}
	to(1, 2)
	if n, topics, err := w.Pending(ctx); err != nil || n != 2 || len(topics) != 1 {
		t.Fatalf("2 records past the base: backlog %d on %v, %v; want 2 on [sw]", n, topics, err)
	}
	st := w.State()
	if st.Base["sw"][0] != 3 || st.Base["sw"][1] != 0 {
		t.Fatalf("state %+v: want base 3 on sw/0, 0 on sw/1", st)
	}
	w2, err := NewShare(ctx, ShareConfig{Brokers: addrs, Group: "sg"})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	w2.SetState(st)
	if n, _, err := w2.Pending(ctx); err != nil || n != 2 {
		t.Fatalf("a new watcher with the state: backlog %d, %v; want 2", n, err)
	}

	wl, err := NewShare(ctx, ShareConfig{Brokers: addrs, Group: "sl"})
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()
	wl.SetState(st)
	if n, _, err := wl.pending(ctx, false); err != nil || n != 2 {
		t.Fatalf("group sl (latest), wait's reading: backlog %d, %v; want 2", n, err)
	}
	if n, _, err := wl.Pending(ctx); err != nil || n != 0 {
		t.Fatalf("group sl (latest), Pending: backlog %d, %v; want 0", n, err)
	}
	if n, _, err := wl.pending(ctx, false); err != nil || n != 0 {
		t.Fatalf("group sl (latest), wait's reading after Pending settled: backlog %d, %v; want 0", n, err)
	}
	to(0, 1)
	if n, _, err := wl.pending(ctx, false); err != nil || n != 1 {
		t.Fatalf("group sl (latest), a new record: backlog %d, %v; want 1", n, err)
	}
}
