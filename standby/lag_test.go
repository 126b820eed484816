package standby

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

func produce(t *testing.T, addrs []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for range n {
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// twoPartitions starts a cluster with topic t of two partitions and returns
// its addresses, a client, and to(p), which produces a record to partition p.
func twoPartitions(t *testing.T) ([]string, *kgo.Client, func(p int32)) {
	t.Helper()
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "t"))
	cl, _ := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	t.Cleanup(cl.Close)
	to := func(p int32) {
		t.Helper()
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: "t", Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return addrs, cl, to
}

// The lag watcher wakes on records past the group's committed offsets
// (topics taken from its commits), not on those already committed, and
// never on broker errors.
func TestLagWatcher(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "orders"))
	produce(t, addrs, "orders", 4)
	cl, _ := kgo.NewClient(kgo.SeedBrokers(addrs...))
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	offs := kadm.Offsets{}
	ends.Each(func(e kadm.ListedOffset) { offs.Add(kadm.Offset{Topic: e.Topic, Partition: e.Partition, At: e.Offset}) })
	if _, err := adm.CommitOffsets(t.Context(), "svc", offs); err != nil {
		t.Fatal(err)
	}

	log := &syncBuf{}
	rec := &countingObserver{}
	o := Options{Brokers: addrs, Group: "svc", Poll: 20 * time.Millisecond, BrokerTimeout: 2 * time.Second,
		Observer: rec, Logger: slog.New(slog.NewJSONHandler(log, nil))}
	w, err := newLagWatcher(t.Context(), &o, o.Logger)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	wake := make(chan string, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.watch(ctx, wake); close(done) }()
	select {
	case src := <-wake:
		t.Fatalf("woke (%s) with everything committed", src)
	case <-time.After(300 * time.Millisecond):
	}
	produce(t, addrs, "orders", 1)
	select {
	case src := <-wake:
		if src != "kafka" {
			t.Fatalf("source %q", src)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no wake after a record past the commits; log:\n%s", log.String())
	}
	<-done
	cancel()
	if rec.requests() == 0 {
		t.Error("no broker requests counted")
	}

	// The broker goes away: polls fail, nothing wakes.
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	c.Close()
	go w.watch(ctx, wake)
	select {
	case src := <-wake:
		t.Fatalf("woke (%s) while the broker was down", src)
	case <-time.After(time.Second):
	}
	if !strings.Contains(log.String(), "lag poll failed; polling on, no wake on errors") {
		t.Errorf("broker errors not logged:\n%s", log.String())
	}
}

type countingObserver struct {
	nopObserver
	n atomic.Int64
}

func (o *countingObserver) BrokerRequests(n int) { o.n.Add(int64(n)) }

func (o *countingObserver) requests() int64 { return o.n.Load() }

// A partition the group never committed counts from its end offset when
// first seen: older records are no lag, a newer one is lag until the group
// commits it (the service must not sleep on it, nor miss its wake).
func TestLagUncommittedPartition(t *testing.T) {
	addrs, cl, to := twoPartitions(t)
	adm := kadm.NewClient(cl)
	commit := func(p int32, at int64) {
		t.Helper()
		offs := kadm.Offsets{}
		offs.Add(kadm.Offset{Topic: "t", Partition: p, At: at})
		if _, err := adm.CommitOffsets(t.Context(), "g", offs); err != nil {
			t.Fatal(err)
		}
	}
	to(0)
	to(1)
	to(1) // old records of partition 1, never committed
	commit(0, 1)
	o := Options{Brokers: addrs, Group: "g", Poll: 20 * time.Millisecond, BrokerTimeout: 2 * time.Second, Observer: nopObserver{}}
	w, err := newLagWatcher(t.Context(), &o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	lag := func() int64 {
		t.Helper()
		n, _, err := w.lag(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := lag(); n != 0 {
		t.Fatalf("lag %d with partition 0 committed and partition 1 never committed, want 0", n)
	}
	to(1)
	if n := lag(); n != 1 {
		t.Fatalf("lag %d after a new record on the uncommitted partition, want 1", n)
	}
	if n := lag(); n != 1 {
		t.Fatalf("lag %d on the next poll, want still 1 (not taken as old)", n)
	}
	commit(1, 3)
	if n := lag(); n != 0 {
		t.Fatalf("lag %d once the group committed it, want 0", n)
	}
}

// The lag base of never-committed partitions is kept in the state file: a
// record that lands in one while no kcr standby runs wakes the service when
// a new one starts on the same image directory.
func TestLagBaseSurvivesRestart(t *testing.T) {
	addrs, cl, to := twoPartitions(t)
	to(0)
	to(1)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 1})
	if _, err := kadm.NewClient(cl).CommitOffsets(t.Context(), "g", offs); err != nil {
		t.Fatal(err)
	}
	withLag := func(o *Options) {
		o.Brokers, o.Group, o.Poll, o.BrokerTimeout = addrs, "g", 20*time.Millisecond, 2*time.Second
	}
	dir := filepath.Join(t.TempDir(), "img")
	r := startRig(t, newFake(), dir, withLag)
	r.waitState(StateStandby) // partition 1 (1 record, never committed) seen
	r.end()
	to(1) // while no kcr standby runs
	f := newFake()
	r2 := startRig(t, f, dir, withLag)
	r2.waitState(StateRunning)
	if starts, restores, _ := f.snapshot(); starts != 0 || len(restores) != 1 {
		t.Fatalf("%d cold starts, restores %v: want the kept image restored", starts, restores)
	}
	if !strings.Contains(r2.log.String(), `"source":"kafka"`) {
		t.Fatalf("not woken by Kafka lag:\n%s", r2.log.String())
	}
}
