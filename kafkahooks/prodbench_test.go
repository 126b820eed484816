package kafkahooks

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// Measurements on the production-defaults broker ($KCR_KAFKA_PROD_BROKERS,
// group.initial.rebalance.delay.ms=3000) of what WithGroupHandover buys and
// costs; one checkpoint cycle per iteration, simulated in-process (no CRIU):
//
//	KCR_KAFKA_PROD_BROKERS=127.0.0.1:9094 go test -run '^$' -bench Prod -benchtime 1x -count 3 ./kafkahooks
//
// docs/kafka-go-restore-time.md has the figures.

// prodBenchConfig is the group reader of the measurements: a 6 s session
// (the pipeline example's), heartbeats every second.
func prodBenchConfig(addrs []string, topic, group string) kafka.ReaderConfig {
	return kafka.ReaderConfig{Brokers: addrs, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		MaxWait: 100 * time.Millisecond, SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second,
		RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 100 * time.Millisecond}
}

// BenchmarkProdRestore: restore → first record of a group reader that was
// down for a while, with and without WithGroupHandover. Beyond the session
// timeout the kept member has expired and the initial delay comes back.
func BenchmarkProdRestore(b *testing.B) {
	addrs := prodBrokers(b)
	for _, handover := range []bool{false, true} {
		for _, down := range []time.Duration{time.Second, 4 * time.Second, 5 * time.Second, 7 * time.Second} {
			if !handover && down > time.Second {
				continue // the same 3 s at any down time
			}
			b.Run(fmt.Sprintf("handover=%v/down=%v", handover, down), func(b *testing.B) {
				var total time.Duration
				for range b.N {
					total += prodRestoreOnce(b, addrs, handover, down)
				}
				b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "restore-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

func prodRestoreOnce(b *testing.B, addrs []string, handover bool, down time.Duration) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	topic, _ := prodTopic(b, addrs, 3, 30)
	reg := notify.NewRegistry()
	hook(reg, func(context.Context) error { time.Sleep(down); return nil }, nil)
	log, _ := newLog(b)
	opts := []ReaderOpt{WithRegistry(reg), WithLogger(log)}
	if handover {
		opts = append(opts, WithGroupHandover())
	}
	r := NewReader(prodBenchConfig(addrs, topic, topic+"-g"), opts...)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 15 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := reg.Simulate(ctx, notify.SimRestore, down+10*time.Second); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if _, err := r.FetchMessage(ctx); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// BenchmarkProdTakeover: the cost of WithGroupHandover in a group of two.
// Member a is checkpointed and stays down; how long until member b owns
// every partition (it gets a's at once when a leaves, but only when a's
// session expires when a kept its membership).
func BenchmarkProdTakeover(b *testing.B) {
	addrs := prodBrokers(b)
	for _, handover := range []bool{false, true} {
		b.Run(fmt.Sprintf("handover=%v", handover), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				total += prodTakeoverOnce(b, addrs, handover)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "takeover-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func prodTakeoverOnce(b *testing.B, addrs []string, handover bool) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	const parts = 4
	topic, adm := prodTopic(b, addrs, parts, 40)
	group := topic + "-g"
	log, _ := newLog(b)
	cfg := prodBenchConfig(addrs, topic, group)
	regA := notify.NewRegistry()
	// a's checkpoint: a is never restored. Registered before a, this
	// probe's after hook runs first and holds a's until the end.
	release := make(chan struct{})
	hook(regA, nil, func(context.Context, notify.Event) error { <-release; return nil })
	optsA := []ReaderOpt{WithRegistry(regA), WithLogger(log), WithClientID("member-a")}
	if handover {
		optsA = append(optsA, WithGroupHandover())
	}
	a := NewReader(cfg, optsA...)
	defer a.Close()
	defer close(release)
	bb := NewReader(cfg, WithRegistry(notify.NewRegistry()), WithLogger(log), WithClientID("member-b"))
	defer bb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	consumeCommitting(ctx, a, bb)
	// members: the members and their partitions once the group is stable.
	members := func() map[string][]int32 {
		state, ms, err := tryGroupMembers(adm, group, topic)
		if err != nil || state != "Stable" {
			return nil
		}
		return ms
	}
	both := func() bool {
		ms := members()
		n := 0
		for _, ps := range ms {
			if len(ps) > 0 {
				n++
			}
		}
		return n == 2
	}
	if !wait.Until(30*time.Second, both) {
		b.Fatal("two members did not join")
	}
	go regA.Simulate(context.Background(), notify.SimRestore, time.Minute)
	t0 := time.Now()
	var ms map[string][]int32
	if !wait.Until(30*time.Second, func() bool {
		ms = members()
		for _, ps := range ms {
			if len(ms) == 1 && len(ps) == parts {
				return true
			}
		}
		return false
	}) {
		b.Fatalf("member b did not get all %s partitions: %v", strconv.Itoa(parts), ms)
	}
	return time.Since(t0)
}
