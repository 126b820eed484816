package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

func TestParseTopics(t *testing.T) {
	ts, err := parseTopics("orders:3, results:1,x")
	if err != nil {
		t.Fatal(err)
	}
	want := []topic{{"orders", 3}, {"results", 1}, {"x", 1}}
	if fmt.Sprint(ts) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", ts, want)
	}
	for _, bad := range []string{"a:0", "a:x", ":3"} {
		if _, err := parseTopics(bad); err == nil {
			t.Errorf("parseTopics(%q) did not fail", bad)
		}
	}
}

// TestKafkaGoGroups checks that segmentio/kafka-go's producer and consumer
// groups (JoinGroup, SyncGroup, Heartbeat, OffsetCommit, OffsetFetch,
// LeaveGroup) work against the embedded broker: a member commits part of
// the topic and leaves, the next member of the group resumes at the commit,
// and two members share the partitions.
func TestKafkaGoGroups(t *testing.T) {
	opts, err := options("127.0.0.1:0", "orders:3", time.Second, "none")
	if err != nil {
		t.Fatal(err)
	}
	_, addrs := kafkatest.Cluster(t, opts...)
	addr := addrs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "orders", Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	produce := func(from, to int) {
		t.Helper()
		var msgs []kafka.Message
		for i := from; i < to; i++ {
			msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("order-%d", i)), Value: []byte("v")})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	produce(0, 300)

	reader := func(id string) *kafka.Reader {
		return kafka.NewReader(kafka.ReaderConfig{
			Brokers: []string{addr}, GroupID: "g", Topic: "orders",
			Dialer:            &kafka.Dialer{ClientID: id, Timeout: 5 * time.Second},
			HeartbeatInterval: 200 * time.Millisecond, SessionTimeout: 2 * time.Second,
			RebalanceTimeout: 2 * time.Second, MaxWait: 100 * time.Millisecond,
			StartOffset: kafka.FirstOffset,
		})
	}
	seen := map[string]int{}
	fetch := func(r *kafka.Reader, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			seen[string(m.Key)]++
			if err := r.CommitMessages(ctx, m); err != nil {
				t.Fatalf("commit: %v", err)
			}
		}
	}

	t0 := time.Now()
	a := reader("a")
	fetch(a, 100)
	t.Logf("member a: joined and consumed 100 in %v", time.Since(t0))
	// Longer than the session timeout: heartbeats must keep a in the group.
	time.Sleep(2500 * time.Millisecond)
	produce(300, 310)
	fetch(a, 10)
	if err := a.Close(); err != nil { // LeaveGroup
		t.Fatalf("close a: %v", err)
	}

	t0 = time.Now()
	b := reader("b")
	fetch(b, 200)
	t.Logf("member b: joined after a left and consumed the remaining 200 in %v", time.Since(t0))
	for k, n := range seen {
		if n > 1 {
			t.Errorf("%s consumed %d times: b did not resume at a's commits", k, n)
		}
	}
	if len(seen) != 310 {
		t.Errorf("consumed %d distinct messages, want 310", len(seen))
	}

	// A second member joins: the group rebalances and both consume.
	c2 := reader("c")
	defer c2.Close()
	type got struct {
		who string
		err error
	}
	done := make(chan got, 2)
	for _, m := range []struct {
		who string
		r   *kafka.Reader
	}{{"b", b}, {"c", c2}} {
		go func() {
			for {
				msg, err := m.r.FetchMessage(ctx)
				if err == nil {
					err = m.r.CommitMessages(ctx, msg)
				}
				done <- got{m.who, err}
				if err != nil {
					return
				}
			}
		}()
	}
	per := map[string]int{}
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	next := 310
	for per["b"] == 0 || per["c"] == 0 || per["b"]+per["c"] < next-310 {
		select {
		case g := <-done:
			if g.err != nil {
				t.Fatalf("two members: %s: %v", g.who, g.err)
			}
			per[g.who]++
		case <-tick.C:
			if next < 1310 {
				produce(next, next+10)
				next += 10
			}
		case <-deadline:
			t.Fatalf("two members: after 20s b consumed %d, c %d of %d", per["b"], per["c"], next-310)
		}
	}
	t.Logf("two members: b consumed %d, c %d of %d (rebalances b %d, c %d)", per["b"], per["c"], next-310, b.Stats().Rebalances, c2.Stats().Rebalances)
	b.Close()
}
