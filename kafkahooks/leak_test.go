package kafkahooks

import (
	"bytes"
	"context"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/notify"
)

// TestNoGoroutineLeak runs 20 simulated cycles (restores and resumes) over a
// sync writer, an async writer, a group reader and a partition reader, all
// busy, then closes them: the goroutine count must return to where it was.
func TestNoGoroutineLeak(t *testing.T) {
	k := newFake(t, 2, "l")
	log, _ := newLog(t)
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()

	reg := notify.NewRegistry()
	sw := NewWriter(testWriter(k.addrs, "l"), WithRegistry(reg), WithName("sync"), WithLogger(log))
	at := testWriter(k.addrs, "l")
	at.Async = true
	aw := NewWriter(at, WithRegistry(reg), WithName("async"), WithLogger(log))
	gr := NewReader(groupConfig(k.addrs, "lg", "l", "gr"), WithRegistry(reg), WithName("group"), WithLogger(log))
	pr := NewReader(kafka.ReaderConfig{Brokers: k.addrs, Topic: "l", Partition: 1, MaxWait: 50 * time.Millisecond}, WithRegistry(reg), WithName("partition"), WithLogger(log))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	loop := func(f func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if err := f(i); err != nil && ctx.Err() == nil {
					t.Errorf("client call: %v", err)
					return
				}
			}
		}()
	}
	loop(func(i int) error {
		return sw.WriteMessages(ctx, kafka.Message{Value: []byte(strconv.Itoa(i))})
	})
	loop(func(i int) error {
		time.Sleep(time.Millisecond)
		return aw.WriteMessages(ctx, kafka.Message{Value: []byte(strconv.Itoa(i))})
	})
	loop(func(int) error {
		m, err := gr.FetchMessage(ctx)
		if err != nil {
			return err
		}
		return gr.CommitMessages(ctx, m)
	})
	loop(func(int) error {
		_, err := pr.FetchMessage(ctx)
		return err
	})

	for i := range 20 {
		outcome := notify.SimRestore
		if i%3 == 2 {
			outcome = notify.SimResume
		}
		res, err := reg.Simulate(context.Background(), outcome, 5*time.Second)
		if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
			t.Fatalf("cycle %d: %v %v %v", i, err, res.BeforeErr, res.AfterErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	for _, c := range []interface{ Close() error }{sw, aw, gr, pr} {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}

	const slack = 2
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+slack {
		if time.Now().After(deadline) {
			var b bytes.Buffer
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines after closing, %d before:\n%s", runtime.NumGoroutine(), base, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("goroutines: %d before, %d after 20 cycles", base, runtime.NumGoroutine())
}
