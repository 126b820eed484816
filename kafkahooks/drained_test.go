package kafkahooks

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// Under RequireDrained a Writer whose accepted records
// cannot be acknowledged within the budget vetoes the checkpoint
// (notify.CarryError with the count); every resource resumes, and the
// records are delivered once the broker answers, each exactly once to its
// Completion. Without RequireDrained the same Writer reports the carried
// count to notify.
func TestWriterRequireDrainedVetoes(t *testing.T) {
	for _, require := range []bool{true, false} {
		k := newFake(t, 1, "d")
		bp := newBlockProduce(k.c)
		reg := notify.NewRegistry()
		log, _ := newLog(t)
		var otherAfter atomic.Value
		hook(reg, nil, func(ctx context.Context, ev notify.Event) error {
			otherAfter.Store(ev.Kind)
			bp.release()
			return nil
		})
		var completed, failed atomic.Int64
		tmpl := testWriter(k.addrs, "d")
		tmpl.Async = true
		tmpl.BatchSize = 10
		tmpl.Completion = func(msgs []kafka.Message, err error) {
			if err != nil {
				failed.Add(int64(len(msgs)))
				return
			}
			completed.Add(int64(len(msgs)))
		}
		w := NewWriter(tmpl, WithRegistry(reg), WithLogger(log), WithRetryBackoff(10*time.Millisecond, 100*time.Millisecond))
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("-1")}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "warm-up record", func() bool { return completed.Load() == 1 })
		bp.block()
		const n = 50
		for i := range n {
			if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
		}
		bp.waitHeld(t, 5*time.Second)

		ctx := context.Background()
		if require {
			ctx = notify.WithRequireDrained(ctx)
		}
		res, err := reg.Simulate(ctx, notify.SimRestore, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		rep := res.Before[0]
		var ce *notify.CarryError
		if require {
			if !errors.As(res.BeforeErr, &ce) || ce.Records <= 0 || !rep.CarryVeto || rep.Carried != ce.Records {
				t.Fatalf("require-drained: before error %v, report %+v: want a carry veto with the count", res.BeforeErr, rep)
			}
			if res.Event.Kind != notify.Resume || otherAfter.Load() != notify.Resume {
				t.Errorf("require-drained: event %v, other resource %v: want every resource resumed", res.Event.Kind, otherAfter.Load())
			}
		} else {
			if res.BeforeErr != nil || rep.CarryVeto || rep.Carried <= 0 || rep.Carried != decodeReport[WriterReport](t, rep.Details).RecordsCarried {
				t.Fatalf("carried: before error %v, report %+v: want no veto and the carried count", res.BeforeErr, rep)
			}
		}
		waitFor(t, 10*time.Second, "every record acknowledged", func() bool { return completed.Load() == n+1 })
		// The Writer goes on writing after the veto.
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("after")}); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if c, f := completed.Load(), failed.Load(); c != n+2 || f != 0 {
			t.Errorf("require=%v: %d completions, %d failed; want %d, 0", require, c, f, n+2)
		}
		seen := map[string]bool{}
		for _, r := range kafkatest.ReadTopic(t, k.addrs, "d") {
			seen[string(r.Value)] = true
		}
		for i := -1; i < n; i++ {
			if !seen[strconv.Itoa(i)] {
				t.Errorf("require=%v: record %d missing from the topic", require, i)
			}
		}
		t.Logf("require=%v: carried %d, error %v", require, rep.Carried, res.BeforeErr)
	}
}
