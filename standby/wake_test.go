package standby

import (
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

type countingObserver struct {
	nopObserver
	n atomic.Int64
}

func (o *countingObserver) BrokerRequests(n int) { o.n.Add(int64(n)) }

func (o *countingObserver) requests() int64 { return o.n.Load() }

// The Kafka wake's base of never-committed partitions is kept in the state
// file: a record that lands in one while no kcr standby runs wakes the
// service when a new one starts on the same image directory.
func TestWakeBaseSurvivesRestart(t *testing.T) {
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

// A transactional upstream: the service sleeps though the group's commits
// stay below the end offsets (a marker past each transaction), an aborted
// transaction does not wake it, a committed one does.
func TestSleepsWithTransactionalUpstream(t *testing.T) {
	addrs, cl, _ := twoPartitions(t)
	kafkatest.ProduceTxn(t, addrs, "t", 0, 3, true)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 3})
	offs.Add(kadm.Offset{Topic: "t", Partition: 1, At: 0})
	if _, err := kadm.NewClient(cl).CommitOffsets(t.Context(), "g", offs); err != nil {
		t.Fatal(err)
	}
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.Brokers, o.Group, o.BrokerTimeout = addrs, "g", 2*time.Second
	})
	r.waitState(StateStandby)
	kafkatest.ProduceTxn(t, addrs, "t", 1, 2, false)
	time.Sleep(300 * time.Millisecond)
	if _, restores, _ := f.snapshot(); len(restores) != 0 {
		t.Fatalf("restores %v after an aborted transaction, want none; log:\n%s", restores, r.log.String())
	}
	kafkatest.ProduceTxn(t, addrs, "t", 1, 1, true)
	r.waitState(StateRunning)
	if !strings.Contains(r.log.String(), `"source":"kafka"`) {
		t.Fatalf("not woken by Kafka:\n%s", r.log.String())
	}
}
