package kafkahooks

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/notify"
)

// With MaxAttempts 1, records whose produce request a
// checkpoint cuts off fail with the interruption. The Writer's report
// counts them (records_interrupted) beside the requests
// (requests_interrupted): exactly the records callers were told failed
// because of the checkpoint, sync and async.
func TestWriterCountsInterruptedRecords(t *testing.T) {
	for _, async := range []bool{false, true} {
		k := newFake(t, 1, "i")
		bp := newBlockProduce(k.c)
		reg := notify.NewRegistry()
		log, _ := newLog(t)
		var toldInterrupted, toldOther atomic.Int64
		tell := func(n int, err error) {
			var ie *interruptedError
			switch {
			case err == nil:
			case errors.As(err, &ie):
				toldInterrupted.Add(int64(n))
			default:
				toldOther.Add(int64(n))
			}
		}
		tmpl := testWriter(k.addrs, "i")
		tmpl.MaxAttempts = 1
		tmpl.BatchSize = 5
		tmpl.Async = async
		if async {
			tmpl.Completion = func(msgs []kafka.Message, err error) { tell(len(msgs), err) }
		}
		w := NewWriter(tmpl, WithRegistry(reg), WithLogger(log))
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("warm")}); err != nil {
			t.Fatal(err)
		}
		bp.block()
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msgs := make([]kafka.Message, 5)
				for i := range msgs {
					msgs[i] = kafka.Message{Value: []byte(strconv.Itoa(g*10 + i))}
				}
				err := w.WriteMessages(context.Background(), msgs...)
				if async {
					return
				}
				var we kafka.WriteErrors
				if errors.As(err, &we) {
					for _, e := range we {
						tell(1, e)
					}
				} else if err != nil {
					tell(len(msgs), err)
				}
			}()
		}
		bp.waitHeld(t, 5*time.Second)
		time.Sleep(50 * time.Millisecond)
		res, err := reg.Simulate(context.Background(), notify.SimRestore, 500*time.Millisecond)
		if err != nil || res.BeforeErr != nil {
			t.Fatalf("simulate: %v %v", err, res.BeforeErr)
		}
		bp.release()
		wg.Wait()
		// The counts are running totals; a second cycle, once every caller
		// has its answer, reports them all.
		waitFor(t, 10*time.Second, "carried records delivered", func() bool { return w.records() == 0 })
		res, err = reg.Simulate(context.Background(), notify.SimResume, 5*time.Second)
		if err != nil || res.BeforeErr != nil {
			t.Fatalf("second simulate: %v %v", err, res.BeforeErr)
		}
		w.Close()
		after := decodeReport[WriterReport](t, res.After[0].Details)
		if after.WriterRestore == nil {
			t.Fatalf("async=%v: after report %v has no after-restore part", async, res.After[0].Details)
		}
		reqs, recs := after.RequestsInterrupted, after.RecordsInterrupted
		t.Logf("async=%v: requests_interrupted %d, records_interrupted %d; callers told: %d interrupted, %d other errors",
			async, reqs, recs, toldInterrupted.Load(), toldOther.Load())
		if reqs == 0 || toldInterrupted.Load() == 0 {
			t.Fatalf("async=%v: no request interrupted (%d), no caller told (%d): the test did not cut a request off", async, reqs, toldInterrupted.Load())
		}
		if recs != toldInterrupted.Load() {
			t.Errorf("async=%v: records_interrupted %d, but %d records were told failed by the interruption", async, recs, toldInterrupted.Load())
		}
	}
}
