// Command wakebench measures kcr standby's Kafka wake (package kafkawake)
// on a real broker, for scripts/bench-wake.sh: the broker requests per
// second of a watcher whose group has nothing to do (a sleeping service),
// and the detection latency, from the start of a produce call to the
// watcher's Wait returning. It prints one line of key=value figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	poll := flag.Duration("poll", 0, "the watcher's Poll (0: long-polling fetch)")
	wakes := flag.Int("wakes", 30, "detections to time")
	asleep := flag.Duration("asleep", 30*time.Second, "how long to count the requests of a watcher with nothing to do")
	flag.Parse()
	if err := run(strings.Split(*brokers, ","), *poll, *wakes, *asleep); err != nil {
		fmt.Fprintln(os.Stderr, "wakebench:", err)
		os.Exit(1)
	}
}

func run(brokers []string, poll time.Duration, wakes int, asleep time.Duration) error {
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic, group := fmt.Sprintf("kcr-wakebench-%d", time.Now().UnixNano()), fmt.Sprintf("kcr-wakebench-%d", os.Getpid())
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		return err
	}
	defer adm.DeleteTopics(context.Background(), topic)
	defer adm.DeleteGroup(context.Background(), group)
	commitEnds := func() error {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return err
		}
		_, err = adm.CommitOffsets(ctx, group, ends.Offsets())
		return err
	}
	if err := commitEnds(); err != nil {
		return err
	}
	var reqs atomic.Int64
	w, err := kafkawake.New(ctx, kafkawake.Config{Brokers: brokers, Group: group, Topics: []string{topic}, Poll: poll,
		Logger: slog.New(slog.DiscardHandler), Requests: func(n int) { reqs.Add(int64(n)) }})
	if err != nil {
		return err
	}
	defer w.Close()

	// Asleep: nothing arrives.
	actx, cancel := context.WithTimeout(ctx, asleep)
	w.Wait(actx)
	cancel()
	perSec := float64(reqs.Load()) / asleep.Seconds()

	var lat, rtt []time.Duration
	for range wakes {
		done := make(chan time.Time, 1)
		go func() {
			w.Wait(ctx)
			done <- time.Now()
		}()
		// The watcher has read the group and waits at the broker (or
		// between polls, at a random phase).
		time.Sleep(time.Second + rand.N(200*time.Millisecond))
		t0 := time.Now()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr(); err != nil {
			return err
		}
		t1 := time.Now()
		select {
		case t2 := <-done:
			lat, rtt = append(lat, t2.Sub(t0)), append(rtt, t1.Sub(t0))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no detection within 30 s")
		}
		if err := commitEnds(); err != nil {
			return err
		}
	}
	fmt.Printf("poll=%v requests_per_s_asleep=%.2f detect_p50_ms=%.2f detect_p95_ms=%.2f detect_max_ms=%.2f produce_p50_ms=%.2f wakes=%d\n",
		poll, perSec, pct(lat, 50), pct(lat, 95), pct(lat, 100), pct(rtt, 50), len(lat))
	return nil
}

// pct is the p-th percentile of ds in milliseconds (nearest rank).
func pct(ds []time.Duration, p int) float64 {
	s := slices.Sorted(slices.Values(ds))
	i := max(0, (len(s)*p+99)/100-1)
	return float64(s[i].Microseconds()) / 1000
}
