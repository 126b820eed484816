package kafkahooks

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// lastPartition is a kafka.Balancer that puts every record on the highest
// partition the Writer knows of.
type lastPartition struct{}

func (lastPartition) Balance(_ kafka.Message, partitions ...int) int {
	return partitions[len(partitions)-1]
}

// carryTopicCase writes n records that the broker holds (so they are
// carried), runs change in the before phase (after the Writer's hook), then
// a restore, and returns the Writer and the counts of records its
// Completion saw succeed and fail.
func carryTopicCase(t *testing.T, k *fake, topic string, n int, tmplSet func(*kafka.Writer), change func(context.Context) error) (w *Writer, ok, failed *atomic.Int64, lastErr *atomic.Value) {
	t.Helper()
	bp := newBlockProduce(k.c)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	hook(reg, change, func(ctx context.Context, ev notify.Event) error {
		bp.release()
		return nil
	})
	ok, failed, lastErr = new(atomic.Int64), new(atomic.Int64), new(atomic.Value)
	tmpl := testWriter(k.addrs, topic)
	tmpl.Async = true
	tmpl.Completion = func(msgs []kafka.Message, err error) {
		if err != nil {
			// Stored before the count a test waits on, so that it reads
			// this error once the count is reached.
			lastErr.Store(err)
			failed.Add(int64(len(msgs)))
			return
		}
		ok.Add(int64(len(msgs)))
	}
	tmplSet(tmpl)
	w = NewWriter(tmpl, WithRegistry(reg), WithLogger(log), WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	t.Cleanup(func() { w.Close() })
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the warm-up record", func() bool { return ok.Load() == 1 })
	ok.Store(0)
	bp.block()
	for i := range n {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	bp.waitHeld(t, 5*time.Second)
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 500*time.Millisecond)
	if err != nil || res.BeforeErr != nil {
		t.Fatalf("simulate: %v %v", err, res.BeforeErr)
	}
	rep := decodeReport[WriterReport](t, res.Before[0].Details) // the Writer's hook runs first
	if rep.RecordsCarried == 0 {
		t.Fatalf("before report %+v: no record carried, the case tests nothing", rep)
	}
	return w, ok, failed, lastErr
}

// TestCarriedPartitionGone: the topic is recreated with fewer
// partitions while records for its last partition are carried. They must
// fail with a CarriedFailedError (the partition no longer exists; they are
// not moved to another partition) instead of being resent forever with the
// gate closed, and a new write must succeed.
func TestCarriedPartitionGone(t *testing.T) {
	k := newFake(t, 4, "shrink")
	adm := admin(t, k.addrs)
	const n = 10
	w, _, failed, lastErr := carryTopicCase(t, k, "shrink", n, func(w *kafka.Writer) { w.Balancer = lastPartition{} },
		func(ctx context.Context) error {
			if _, err := adm.DeleteTopics(ctx, "shrink"); err != nil {
				return err
			}
			_, err := adm.CreateTopic(ctx, 2, 1, nil, "shrink")
			return err
		})
	waitFor(t, 10*time.Second, "the carried records for the vanished partition to fail", func() bool { return failed.Load() == n })
	var cf *CarriedFailedError
	if err, _ := lastErr.Load().(error); !errors.As(err, &cf) {
		t.Fatalf("carried records failed with %v, want a CarriedFailedError", err)
	}
	t.Logf("carried records failed with: %v", lastErr.Load())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("after")}); err != nil {
		t.Fatalf("write after the restore: %v (the gate stayed closed?)", err)
	}
}

// TestCarriedAutoCreate: with AllowAutoTopicCreation (and a broker that
// allows it), a topic deleted while records are carried is created again by
// the resend, as kafka-go does for new writes: the carried records are
// delivered, not failed.
func TestCarriedAutoCreate(t *testing.T) {
	k := newFakeWith(t, []kfake.Opt{kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1)}, 1, "auto")
	adm := admin(t, k.addrs)
	const n = 10
	w, ok, failed, lastErr := carryTopicCase(t, k, "auto", n, func(w *kafka.Writer) { w.AllowAutoTopicCreation = true },
		func(ctx context.Context) error {
			_, err := adm.DeleteTopics(ctx, "auto")
			return err
		})
	waitFor(t, 10*time.Second, "the carried records to be delivered or failed", func() bool { return ok.Load()+failed.Load() == n })
	if failed.Load() != 0 {
		t.Fatalf("%d carried records failed (%v); the topic can be auto-created, as for new writes", failed.Load(), lastErr.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("after")}); err != nil {
		t.Fatalf("write after the restore: %v", err)
	}
	waitFor(t, 10*time.Second, "the new record", func() bool { return ok.Load() == n+1 })
	w.Close()
	got := map[string]bool{}
	for _, r := range kafkatest.ReadTopic(t, k.addrs, "auto") {
		got[string(r.Value)] = true
	}
	for i := range n {
		if !got[strconv.Itoa(i)] {
			t.Fatalf("carried record %d missing from the recreated topic (have %v)", i, got)
		}
	}
}
