package main

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/kafkahooks"
	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
)

// TestDrainGivesOneResultPerOrder checkpoints (in process, with
// notify.Simulate) a draining pipeline under load, restores and resumes it,
// and checks with an independent client that every order has exactly one
// result and that no result sequence number was used twice.
func TestDrainGivesOneResultPerOrder(t *testing.T) {
	testDrain(t, func(brokers []string, reg *notify.Registry) (Fetcher, Producer) {
		r := kafkahooks.NewReader(kafka.ReaderConfig{
			Brokers: brokers, GroupID: "pipeline", Topic: "orders", StartOffset: kafka.FirstOffset,
			MaxWait: 100 * time.Millisecond, SessionTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond,
			RebalanceTimeout: time.Second, JoinGroupBackoff: 50 * time.Millisecond,
		}, kafkahooks.WithRegistry(reg), kafkahooks.WithClientID("pipeline"))
		t.Cleanup(func() { r.Close() })
		w := kafkahooks.NewWriter(&kafka.Writer{
			Addr: kafka.TCP(brokers...), Topic: "results", Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		}, kafkahooks.WithRegistry(reg), kafkahooks.WithClientID("pipeline"))
		t.Cleanup(func() { w.Close() })
		return r, w
	})
}

// TestDrainGivesOneResultPerOrderFranz is TestDrainGivesOneResultPerOrder
// with the franz-go clients of -client franz, and of -client franz -kgo-balancer server (KIP-848).
func TestDrainGivesOneResultPerOrderFranz(t *testing.T) {
	t.Run("classic", func(t *testing.T) { testDrainFranz(t, false) })
	t.Run("kip848", func(t *testing.T) { testDrainFranz(t, true) })
}

func testDrainFranz(t *testing.T, kip848 bool) {
	balancer := "client"
	if kip848 {
		balancer = "server"
	}
	testDrain(t, func(brokers []string, reg *notify.Registry) (Fetcher, Producer) {
		inOpts, outOpts := kgoOpts(config{brokers: brokers, clientID: "pipeline", group: "pipeline", in: "orders", out: "results", balancer: balancer})
		icl, err := kgohooks.New(append(inOpts, kgo.FetchMaxWait(100*time.Millisecond), kgo.SessionTimeout(time.Second),
			kgo.HeartbeatInterval(100*time.Millisecond)), kgohooks.WithRegistry(reg), kgohooks.WithName("in"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(icl.Close)
		ocl, err := kgohooks.New(outOpts, kgohooks.WithRegistry(reg), kgohooks.WithName("out"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ocl.Close)
		return newKgoFetcher(icl), kgoProducer{ocl}
	})
}

func testDrain(t *testing.T, clients func([]string, *notify.Registry) (Fetcher, Producer)) {
	const orders = 600
	_, brokers := kafkatest.Cluster(t, kfake.SeedTopics(3, "orders", "results"), kafkatest.FastGroups())

	reg := notify.NewRegistry()
	in, out := clients(brokers, reg)
	cache, err := BuildCache(context.Background(), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{In: in, Out: out, Cache: cache, Registry: reg}
	p.init()
	_, coldID := reg.Identity()
	reg.Register("pipeline", notify.Func(p.Drain, p.Continue))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produced := make(chan error, 1)
	go func() {
		for n := 1; n <= orders; n++ {
			v, _ := json.Marshal(map[string]any{"id": "order-" + strconv.Itoa(n), "n": n})
			if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte("order-" + strconv.Itoa(n)), Value: v}).FirstErr(); err != nil {
				produced <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		produced <- nil
	}()

	// Three cycles while orders arrive: restore, resume, restore. The cold
	// instance first makes results of its own (a loaded machine can take
	// longer than the pause between cycles to join the group).
	wait.For(t, 20*time.Second, "the cold instance's first result", func() bool { return p.seq.Load() > 0 })
	for i, outcome := range []notify.SimOutcome{notify.SimRestore, notify.SimResume, notify.SimRestore} {
		time.Sleep(300 * time.Millisecond)
		res, err := reg.Simulate(ctx, outcome, 5*time.Second)
		if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
			t.Fatalf("cycle %d: %v / %v / %v", i, err, res.BeforeErr, res.AfterErr)
		}
	}
	if err := <-produced; err != nil {
		t.Fatalf("producing orders: %v", err)
	}

	got := readResults(t, brokers, orders, 20*time.Second)
	for n := 1; n <= orders; n++ {
		id := "order-" + strconv.Itoa(n)
		if got.perOrder[id] != 1 {
			t.Errorf("%s has %d results, want 1", id, got.perOrder[id])
		}
	}
	// Every result names the instance that made it, the cold one too (the
	// demo's verify output lists them).
	if got.perInstance[""] > 0 || got.perInstance[coldID] == 0 {
		t.Errorf("results per instance %v: want some of the cold instance %s and none without an instance", got.perInstance, coldID)
	}
	for seq, k := range got.perSeq {
		if k > 1 {
			t.Errorf("result sequence %d used %d times", seq, k)
		}
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

type results struct {
	perOrder    map[string]int
	perSeq      map[uint64]int
	perInstance map[string]int
}

// readResults reads the results topic from the start until every one of n
// orders has a result, then a little longer, so that second results show.
func readResults(t *testing.T, brokers []string, n int, timeout time.Duration) results {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("results"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	res := results{perOrder: map[string]int{}, perSeq: map[uint64]int{}, perInstance: map[string]int{}}
	deadline := time.Now().Add(timeout)
	var complete time.Time
	for time.Now().Before(deadline) {
		if complete.IsZero() && len(res.perOrder) >= n {
			complete = time.Now()
		}
		if !complete.IsZero() && time.Since(complete) > 500*time.Millisecond {
			return res
		}
		pctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			var v Result
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Errorf("result %s: %v", r.Key, err)
				return
			}
			res.perOrder[string(r.Key)]++
			res.perSeq[v.Seq]++
			res.perInstance[v.Instance]++
		})
	}
	if len(res.perOrder) < n {
		t.Fatalf("only %d of %d orders have a result after %v", len(res.perOrder), n, timeout)
	}
	return res
}

func TestCacheScoreIsStable(t *testing.T) {
	c, err := BuildCache(context.Background(), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Bytes() != 1<<20 {
		t.Fatalf("cache is %d bytes, want 1 MiB", c.Bytes())
	}
	seen := map[uint64]bool{}
	for n := int64(0); n < 100; n++ {
		s := c.Score(n)
		if s != c.Score(n) {
			t.Fatalf("Score(%d) changed", n)
		}
		seen[s] = true
	}
	if len(seen) < 90 {
		t.Fatalf("only %d distinct scores for 100 orders: the cache is not filled", len(seen))
	}
}
