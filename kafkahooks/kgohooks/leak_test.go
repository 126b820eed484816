package kgohooks

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/leakcheck"
	"github.com/kcr-dev/kcr/notify"
)

// Restores replace kgo clients and resumes keep them: after 12 cycles of
// both and Close, no goroutine of a kgo client made since the start is left
// (an image's client whose dials were held would keep its goroutines).
func TestNoKgoGoroutineLeak(t *testing.T) {
	addrs := newCluster(t, 2, "l")
	before := leakcheck.Take()
	reg := notify.NewRegistry()
	prod, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("l"), kgo.ClientID("p")}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	direct, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ClientID("d"), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"l": {0: kgo.NewOffset().At(0)}})}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	group, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ClientID("g"), kgo.ConsumerGroup("lg"), kgo.ConsumeTopics("l"),
		kgo.FetchMaxWait(50 * time.Millisecond)}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 60*time.Second)
	for i := range 12 {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*Client{direct, group} {
			pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			c.PollFetches(pctx)
			pcancel()
		}
		outcome := notify.SimRestore
		if i%2 == 1 {
			outcome = notify.SimResume
		}
		res, err := reg.Simulate(ctx, outcome, 5*time.Second)
		if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
			t.Fatalf("cycle %d: %v, before %v, after %v", i, err, res.BeforeErr, res.AfterErr)
		}
	}
	prod.Close()
	direct.Close()
	group.Close()
	leakcheck.Check(t, before, 5*time.Second, isKgo)
}

// isKgo tells the goroutines running kgo client code from kfake's broker.
func isKgo(g leakcheck.Goroutine) bool {
	return strings.Contains(g.Stack, "franz-go/pkg/kgo.") && !strings.Contains(g.Stack, "pkg/kfake")
}
