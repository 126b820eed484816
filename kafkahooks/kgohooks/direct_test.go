package kgohooks

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

func TestDirectPartitionsAtEndAcrossRestore(t *testing.T) {
	addrs, reg := newRig(t, 1, "d")
	producePlain(t, addrs, "d", vals("old", 10))
	// Registered before the client, so its before hook runs after the
	// client's: these records are produced while the client is torn down,
	// and the client's before-checkpoint report is there to read.
	var c *Client
	var next map[string]int64
	reg.Register("probe", notify.Func(func(context.Context) error {
		producePlain(t, addrs, "d", vals("during", 10))
		if rep, ok := c.Report(); ok && rep.Checkpoint != nil {
			next = rep.NextOffsets
		}
		return nil
	}, nil))
	c = newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"d": {0: kgo.NewOffset().AtEnd()}})})
	ctx := testCtx(t, 15*time.Second)
	select {
	case <-c.resolving:
	case <-ctx.Done():
		t.Fatal("start offset not resolved")
	}
	if n := c.pos.unresolved(); n != 0 {
		t.Fatalf("%d partitions unresolved", n)
	}
	producePlain(t, addrs, "d", vals("before", 10))

	got := pollUpTo(t, ctx, c, nil, 4)
	hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	if next["d/0"] != 10+4 {
		t.Errorf("next offset in the report = %v, want d/0: 14", next)
	}
	producePlain(t, addrs, "d", vals("after", 10))
	got = pollUpTo(t, ctx, c, got, 30)
	// A little longer, to catch redelivered records.
	got = kafkatest.PollMore(ctx, c, got)
	want := slices.Concat(vals("before", 10), vals("during", 10), vals("after", 10))
	if !slices.Equal(got, want) {
		t.Errorf("delivered %d records, want %d in order:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

// Partitions added with AddConsumePartitions to a client built without
// kgo.ConsumePartitions are still consumed after a restore.
func TestAddConsumePartitionsAcrossRestore(t *testing.T) {
	addrs, reg := newRig(t, 1, "d")
	producePlain(t, addrs, "d", vals("old", 3))
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.FetchMaxWait(100 * time.Millisecond)})
	ctx := testCtx(t, 15*time.Second)
	if err := c.AddConsumePartitions(map[string]map[int32]kgo.Offset{"d": {0: kgo.NewOffset().AtEnd()}}); err != nil {
		t.Fatal(err)
	}
	for c.pos != nil && c.pos.unresolved() > 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	producePlain(t, addrs, "d", vals("before", 3))
	got := kafkatest.PollValues(ctx, c, nil, 3)
	hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	producePlain(t, addrs, "d", vals("after", 3))
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	defer pcancel()
	got = kafkatest.PollValues(pctx, c, got, 6)
	if want := slices.Concat(vals("before", 3), vals("after", 3)); !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// A checkpoint before the start offsets of direct partitions are resolved is
// refused (a restored client would not know where to start); after the
// resume they are resolved and consuming starts exactly there.
func TestUnresolvedStartRefusesCheckpoint(t *testing.T) {
	kf := newKfake(t, 1, "d")
	addrs := kf.ListenAddrs()
	producePlain(t, addrs, "d", vals("old", 3))
	release := make(chan struct{})
	kf.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.SleepControl(func() { <-release })
		return nil, nil, false
	})
	reg := notify.NewRegistry()
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"d": {0: kgo.NewOffset().AtEnd()}})}, WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	ctx := testCtx(t, 15*time.Second)
	res, err := reg.Simulate(ctx, notify.SimRestore, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.BeforeErr == nil || !strings.Contains(res.BeforeErr.Error(), "not resolved") {
		t.Fatalf("before error = %v, want start offsets not resolved", res.BeforeErr)
	}
	if res.Event.Kind != notify.Resume || res.AfterErr != nil {
		t.Fatalf("event %v, after error %v; want a clean resume", res.Event.Kind, res.AfterErr)
	}
	close(release)
	for c.pos.unresolved() > 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	producePlain(t, addrs, "d", vals("new", 3))
	got := kafkatest.PollValues(ctx, c, nil, 3)
	if !slices.Equal(got, vals("new", 3)) {
		t.Errorf("delivered %v, want %v", got, vals("new", 3))
	}
}
