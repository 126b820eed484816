package kafkahooks

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/leakcheck"
	"github.com/kcr-dev/kcr/notify"
)

// TestNoGoroutineLeak runs 20 simulated cycles (restores and resumes) over a
// sync writer, an async writer, a group reader and a partition reader, all
// busy, then closes them: every goroutine started since the clients were
// made must end.
func TestNoGoroutineLeak(t *testing.T) {
	k := newFake(t, 2, "l")
	log, _ := newLog(t)
	before := leakcheck.Take()

	reg := notify.NewRegistry()
	sw := NewWriter(testWriter(k.addrs, "l"), WithRegistry(reg), WithName("sync"), WithLogger(log))
	at := testWriter(k.addrs, "l")
	at.Async = true
	aw := NewWriter(at, WithRegistry(reg), WithName("async"), WithLogger(log))
	gr := NewReader(groupConfig(k.addrs, "lg", "l", "gr"), WithRegistry(reg), WithName("group"), WithLogger(log))
	pr := NewReader(kafka.ReaderConfig{Brokers: k.addrs, Topic: "l", Partition: 1, MaxWait: 50 * time.Millisecond}, WithRegistry(reg), WithName("partition"), WithLogger(log))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var calls [4]atomic.Int64 // per client, calls that returned
	loop := func(c *atomic.Int64, f func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if err := f(i); err != nil && ctx.Err() == nil {
					t.Errorf("client call: %v", err)
					return
				}
				c.Add(1)
			}
		}()
	}
	loop(&calls[0], func(i int) error {
		return sw.WriteMessages(ctx, kafka.Message{Value: []byte(strconv.Itoa(i))})
	})
	loop(&calls[1], func(i int) error {
		time.Sleep(time.Millisecond) // paces the async writer, which never waits
		return aw.WriteMessages(ctx, kafka.Message{Value: []byte(strconv.Itoa(i))})
	})
	loop(&calls[2], func(int) error {
		m, err := gr.FetchMessage(ctx)
		if err != nil {
			return err
		}
		return gr.CommitMessages(ctx, m)
	})
	loop(&calls[3], func(int) error {
		_, err := pr.FetchMessage(ctx)
		return err
	})

	for i := range 20 {
		// Every client is busy across every cycle: each has made a call
		// since the last one.
		var seen [len(calls)]int64
		for j := range calls {
			seen[j] = calls[j].Load()
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("a call of every client before cycle %d", i), func() bool {
			for j := range calls {
				if calls[j].Load() == seen[j] {
					return false
				}
			}
			return true
		})
		outcome := notify.SimRestore
		if i%3 == 2 {
			outcome = notify.SimResume
		}
		res, err := reg.Simulate(context.Background(), outcome, 5*time.Second)
		if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
			t.Fatalf("cycle %d: %v %v %v", i, err, res.BeforeErr, res.AfterErr)
		}
	}
	cancel()
	wg.Wait()
	for _, c := range []interface{ Close() error }{sw, aw, gr, pr} {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}

	leakcheck.Check(t, before, 5*time.Second, nil)
}
