package kgohooks

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// produceWhile starts n producers of values prefix-i that must reach the
// closed gate; it returns when all of them are blocked and a wait func.
func produceDuring(t *testing.T, c *Client, prefix string, n int) func() []error {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, v := range vals(prefix, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.ProduceSync(context.Background(), &kgo.Record{Value: []byte(v)}).FirstErr()
		}()
	}
	return func() []error { wg.Wait(); return errs }
}

// duringProbe registers, before the client exists, a resource whose before
// hook runs after the client's (reverse order): it starts n producers of
// prefix-i and waits until all of them wait at the client's closed gate.
func duringProbe(t *testing.T, reg *notify.Registry, c **Client, prefix string, n int) func() []error {
	var results func() []error
	reg.Register("probe", notify.Func(func(context.Context) error {
		results = produceDuring(t, *c, prefix, n)
		wait.Until(3*time.Second, func() bool { return (*c).blocked.Load() >= int64(n) })
		if b := (*c).blocked.Load(); b != int64(n) {
			t.Errorf("%d callers wait at the gate, want %d", b, n)
		}
		return nil
	}, nil))
	return func() []error { return results() }
}

func testProducerCycle(t *testing.T, outcome notify.SimOutcome) {
	addrs, reg := newRig(t, 3, "p")
	var c *Client
	cc := &connCounter{}
	atDump := dumpProbe(reg, cc)
	wait := duringProbe(t, reg, &c, "during", 10)
	c = newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("p"), kgo.ClientID("app"), kgo.Dialer(cc.Dial)})
	ctx := context.Background()
	for _, v := range vals("before", 20) {
		if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	pid0, _, err := c.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if open, _ := cc.counts(); open == 0 {
		t.Fatal("the user's kgo.Dialer was not used")
	}
	kcl0 := c.Underlying()
	res, err := reg.Simulate(ctx, outcome, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wantKind := notify.Restore
	if outcome == notify.SimResume {
		wantKind = notify.Resume
	}
	if res.BeforeErr != nil || res.AfterErr != nil || res.Event.Kind != wantKind {
		t.Fatalf("cycle: before %v, after %v, event %v", res.BeforeErr, res.AfterErr, res.Event.Kind)
	}
	for i, err := range wait() {
		if err != nil {
			t.Errorf("produce during the checkpoint %d: %v", i, err)
		}
	}
	for _, v := range vals("after", 20) {
		if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	pid1, _, err := c.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := atDump.Load(); n != 0 {
		t.Errorf("%d connections open at the dump instant, want 0", n)
	}
	if outcome == notify.SimRestore {
		if pid1 == pid0 || c.Underlying() == kcl0 {
			t.Errorf("restore kept producer id %d (was %d) or the kgo client (%v); a restored copy must get new ones", pid1, pid0, c.Underlying() == kcl0)
		}
		if err := kcl0.ProduceSync(ctx, &kgo.Record{Value: []byte("old")}).FirstErr(); !errors.Is(err, kgo.ErrClientClosed) {
			t.Errorf("the image's kgo client after a restore: produce = %v, want kgo.ErrClientClosed", err)
		}
	} else if pid1 != pid0 || c.Underlying() != kcl0 {
		t.Errorf("resume: producer id %d (was %d), same kgo client %v; want the same client, reconnected", pid1, pid0, c.Underlying() == kcl0)
	}
	id := c.ClientID()
	if outcome == notify.SimRestore {
		if !strings.HasPrefix(id, "app-") || len(id) != len("app-")+8 || id[4:] != res.Event.InstanceID[:8] {
			t.Errorf("client id after restore = %q, want app-%.8s", id, res.Event.InstanceID)
		}
	} else if id != "app" {
		t.Errorf("client id after resume = %q, want app", id)
	}
	want := slices.Concat(vals("before", 20), vals("during", 10), vals("after", 20))
	got := kafkatest.ReadValues(t, addrs, "p", len(want))
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("topic has %d records, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

func TestProducerRestore(t *testing.T) { testProducerCycle(t, notify.SimRestore) }
func TestProducerResume(t *testing.T)  { testProducerCycle(t, notify.SimResume) }

func TestProducerManyCycles(t *testing.T) {
	addrs, reg := newRig(t, 2, "p")
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("p"), kgo.ClientID("app")})
	ctx := context.Background()
	pids := map[int64]bool{}
	var want []string
	outcomes := []notify.SimOutcome{notify.SimRestore, notify.SimResume, notify.SimRestore, notify.SimRestore}
	lastID := "app"
	for i, oc := range append(outcomes, -1) {
		vs := vals(string(rune('a'+i)), 5)
		want = append(want, vs...)
		for _, v := range vs {
			if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		pid, _, err := c.ProducerID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if resumed := i > 0 && outcomes[i-1] == notify.SimResume; pids[pid] != resumed {
			t.Errorf("cycle %d: producer id %d seen before %v, want %v (only a resume keeps it)", i, pid, pids[pid], resumed)
		}
		pids[pid] = true
		if id := c.ClientID(); id != lastID {
			t.Errorf("cycle %d: client id %q, want %q", i, id, lastID)
		}
		if oc < 0 {
			break
		}
		res, err := reg.Simulate(ctx, oc, 5*time.Second)
		if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
			t.Fatalf("cycle %d: %v, before %v, after %v", i, err, res.BeforeErr, res.AfterErr)
		}
		if oc == notify.SimRestore {
			lastID = "app-" + res.Event.InstanceID[:8]
		}
	}
	got := kafkatest.ReadValues(t, addrs, "p", len(want))
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("topic has %d records, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

// Records the broker does not acknowledge within the budget refuse the
// checkpoint; the process resumes with the same producer and they are
// delivered once.
func TestUnflushedRefusesCheckpoint(t *testing.T) {
	kf := newKfake(t, 1, "p")
	addrs := kf.ListenAddrs()
	reg := notify.NewRegistry()
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("p"), kgo.ClientID("app")})
	ctx := testCtx(t, 15*time.Second)
	if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte("x-0")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pid0, _, _ := c.ProducerID(ctx)
	release := make(chan struct{})
	kf.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.SleepControl(func() { <-release })
		return nil, nil, false
	})
	acked := make(chan error, 1)
	c.Produce(ctx, &kgo.Record{Value: []byte("x-1")}, func(_ *kgo.Record, err error) { acked <- err })
	res := hooktest.SimulateRefused(t, ctx, reg, time.Second, ErrRecordsNotFlushed)
	if n := res.Before[0].Details["records_unflushed"]; n != int64(1) {
		t.Errorf("records_unflushed = %v (%T), want 1", n, n)
	}
	// A carry veto, which kcr tells apart from other hook failures (exit 10).
	if rep := res.Before[0]; !rep.CarryVeto || rep.Carried != 1 {
		t.Errorf("report carry_veto %v, records_carried %d: want a veto of 1 record", rep.CarryVeto, rep.Carried)
	}
	close(release)
	if err := <-acked; err != nil {
		t.Fatalf("record buffered at the refused checkpoint: %v", err)
	}
	if pid1, _, _ := c.ProducerID(ctx); pid1 != pid0 {
		t.Errorf("producer id changed from %d to %d by a refused checkpoint", pid0, pid1)
	}
	if id := c.ClientID(); id != "app" {
		t.Errorf("client id %q after a refused checkpoint, want app", id)
	}
	if got := kafkatest.ReadValues(t, addrs, "p", 2); !slices.Equal(got, vals("x", 2)) {
		t.Errorf("topic has %v, want %v", got, vals("x", 2))
	}
}

// Close during a checkpoint releases the callers waiting at the gate with
// kgo.ErrClientClosed, and the cycle ends cleanly.
func TestCloseDuringCheckpointReleasesCallers(t *testing.T) {
	addrs, reg := newRig(t, 1, "p")
	var c *Client
	wait := make(chan error, 1)
	reg.Register("closer", notify.Func(func(context.Context) error {
		go func() { wait <- c.ProduceSync(context.Background(), &kgo.Record{Value: []byte("z")}).FirstErr() }()
		for c.blocked.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		c.Close()
		return nil
	}, nil))
	c, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("p")}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("cycle: %v, before %v, after %v", err, res.BeforeErr, res.AfterErr)
	}
	select {
	case err := <-wait:
		if !errors.Is(err, kgo.ErrClientClosed) {
			t.Errorf("waiting produce after Close = %v, want kgo.ErrClientClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a caller still waits at the gate of a closed client")
	}
	if err := c.ProduceSync(context.Background(), &kgo.Record{Value: []byte("z")}).FirstErr(); !errors.Is(err, kgo.ErrClientClosed) {
		t.Errorf("produce after Close = %v, want kgo.ErrClientClosed", err)
	}
}

// ProduceSync sends its records at once, as kgo's does, instead of waiting
// for the linger (a ProduceSync built on Produce waited the linger, 10 ms a
// call by default). kgo skips the linger once it knows the topic's
// partitions, so the first call warms up.
func TestProduceSyncDoesNotLinger(t *testing.T) {
	addrs := newCluster(t, 1, "t")
	cl, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.ProducerLinger(5 * time.Second)},
		WithRegistry(notify.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testCtx(t, 20*time.Second)
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("warm-up")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	if err := cl.ProduceSync(sctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("ProduceSync with a 5 s linger, topic known: %v", err)
	}
}
