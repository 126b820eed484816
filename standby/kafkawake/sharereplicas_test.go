package kafkawake

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// A share group's Backlog: the records the broker reports unacknowledged
// (kfake made to answer a start offset and a lag), aged from when the
// watcher first saw the log end past the start offset, by its clock: a
// record stamped a year ago that the watcher has just seen is young. The
// age grows while the start offset stays; when the start offset moves
// past records the watcher saw later, the age is theirs; no lag, no
// backlog.
func TestShareWatcherBacklog(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "sb"))
	c.SetGroupConfigs("sg", map[string]string{"share.auto.offset.reset": "earliest"})
	var start, lag atomic.Int64
	c.ControlKey(int16(kmsg.DescribeShareGroupOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := kreq.(*kmsg.DescribeShareGroupOffsetsRequest).ResponseKind().(*kmsg.DescribeShareGroupOffsetsResponse)
		g := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
		g.GroupID = "sg"
		rt := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopic()
		rt.Topic = "sb"
		rp := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopicPartition()
		rp.StartOffset, rp.Lag = start.Load(), lag.Load()
		rt.Partitions = append(rt.Partitions, rp)
		g.Topics = append(g.Topics, rt)
		resp.Groups = append(resp.Groups, g)
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("sb"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(n int) {
		for range n {
			if err := prod.ProduceSync(ctx, &kgo.Record{Timestamp: time.Now().Add(-365 * 24 * time.Hour)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	w, err := NewShare(ctx, ShareConfig{Brokers: addrs, Group: "sg"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if b, err := w.Backlog(ctx); err != nil || b.Records != 0 || !b.Oldest.IsZero() {
		t.Fatalf("no lag: %+v, %v; want no backlog", b, err)
	}

	produce(3)
	lag.Store(3)
	seen := time.Now()
	b, err := w.Backlog(ctx)
	if err != nil || b.Records != 3 || b.Oldest.Before(seen) {
		t.Fatalf("3 records stamped a year ago, just seen: %+v, %v; want 3, oldest seen now (after %v)", b, err, seen)
	}
	time.Sleep(300 * time.Millisecond)
	produce(2)
	lag.Store(5)
	b2, err := w.Backlog(ctx)
	if err != nil || b2.Records != 5 || !b2.Oldest.Equal(b.Oldest) || b2.Age(time.Now()) < 300*time.Millisecond {
		t.Fatalf("2 more, the start offset where it was: %+v, %v; want 5, the same oldest (%v), 300 ms old at least", b2, err, b.Oldest)
	}
	start.Store(3) // the first 3 acknowledged: the oldest is one seen later
	lag.Store(2)
	b3, err := w.Backlog(ctx)
	if err != nil || b3.Records != 2 || !b3.Oldest.After(b.Oldest) {
		t.Fatalf("start offset 3: %+v, %v; want 2, an oldest seen after %v", b3, err, b.Oldest)
	}
	start.Store(5)
	lag.Store(0)
	if b, err := w.Backlog(ctx); err != nil || b.Records != 0 || !b.Oldest.IsZero() {
		t.Fatalf("all acknowledged: %+v, %v; want no backlog", b, err)
	}
}

// A share group's Members: none before a member joins; two members of a
// share group on one partition both count, stable once both have their
// assignment, and ignore leaves members out by client id.
func TestShareWatcherMembers(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "sm"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &ShareWatcher{cfg: ShareConfig{Group: "sg"}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	w.cl = cl
	if n, stable, err := w.Members(ctx, nil); err != nil || n != 0 || !stable {
		t.Fatalf("no group: %d members, stable %v, %v; want 0, stable", n, stable, err)
	}
	for _, id := range []string{"a", "b"} {
		m, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ShareGroup("sg"), kgo.ConsumeTopics("sm"), kgo.ClientID(id))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		go func() {
			for ctx.Err() == nil {
				m.PollFetches(ctx)
			}
		}()
	}
	for {
		n, stable, err := w.Members(ctx, nil)
		nb, _, errb := w.Members(ctx, func(id string) bool { return id == "b" })
		if err == nil && errb == nil && n == 2 && stable && nb == 1 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d members (stable %v, %v), %d without b (%v); want 2, stable, and 1 without b", n, stable, err, nb, errb)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
