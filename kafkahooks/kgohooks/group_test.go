package kgohooks

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// producePlain writes values to topic with an independent kgo client.
func producePlain(t *testing.T, addrs []string, topic string, values []string, extra ...kgo.Opt) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic)}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, v := range values {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGroupConsumerRestoreNoRedeliveryNoSkip(t *testing.T) {
	addrs, reg := newRig(t, 2, "g")
	producePlain(t, addrs, "g", vals("a", 30))
	c := newHooked(t, reg, groupOpts(addrs, "grp", "g"))
	ctx := testCtx(t, 15*time.Second)

	seen := map[string]int{}
	next := map[int32]int64{} // offset after the last record handed out, per partition
	poll := func(max int) int {
		fs := c.PollRecords(ctx, max)
		for _, e := range fs.Errors() {
			t.Fatalf("poll: %v", e.Err)
		}
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			seen[string(r.Value)]++
			next[r.Partition] = r.Offset + 1
			n++
		})
		return n
	}
	for got := 0; got < 12; {
		got += poll(12 - got)
	}

	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	rep := res.Before[0]
	t.Logf("before report: %+v", rep)

	// The broker has exactly what was handed out committed: nothing more
	// (that would skip), nothing less (that would redeliver).
	offs := fetchCommitted(t, ctx, addrs, "grp")
	for p := int32(0); p < 2; p++ {
		o, ok := offs.Lookup("g", p)
		want, handed := next[p]
		switch {
		case handed && (!ok || o.At != want):
			t.Errorf("partition %d: committed %v (present %v), want %d", p, o.At, ok, want)
		case !handed && ok && o.At > 0:
			t.Errorf("partition %d: committed %d, nothing was handed out", p, o.At)
		}
	}

	producePlain(t, addrs, "g", vals("b", 20))
	for total := 12; total < 50 && ctx.Err() == nil; {
		total += poll(-1)
	}
	for _, v := range append(vals("a", 30), vals("b", 20)...) {
		if seen[v] != 1 {
			t.Errorf("record %s delivered %d times, want 1", v, seen[v])
		}
	}
	if len(seen) != 50 {
		t.Errorf("%d distinct records, want 50", len(seen))
	}
}

// fetchCommitted returns the group's committed offsets, read by an
// independent admin client.
func fetchCommitted(t *testing.T, ctx context.Context, addrs []string, group string) kadm.OffsetResponses {
	t.Helper()
	offs, err := kadm.NewClient(mustClient(t, addrs)).FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		t.Fatalf("fetch offsets of group %s: %v", group, err)
	}
	return offs
}

func mustClient(t *testing.T, addrs []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// With DisableAutoCommit, a late commit of a record handed out before the
// checkpoint must not move the group's offset back below what the new
// member committed.
func TestLateCommitDoesNotGoBack(t *testing.T) {
	addrs, reg := newRig(t, 1, "m")
	producePlain(t, addrs, "m", vals("a", 10))
	c := newHooked(t, reg, groupOpts(addrs, "mg", "m", kgo.DisableAutoCommit()))
	ctx := testCtx(t, 15*time.Second)
	var old []*kgo.Record
	for len(old) < 10 && ctx.Err() == nil {
		old = append(old, c.PollFetches(ctx).Records()...)
	}
	if err := c.CommitRecords(ctx, old...); err != nil {
		t.Fatal(err)
	}
	hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	producePlain(t, addrs, "m", vals("b", 5))
	var fresh []*kgo.Record
	for len(fresh) < 5 && ctx.Err() == nil {
		fresh = append(fresh, c.PollFetches(ctx).Records()...)
	}
	if v := string(fresh[0].Value); v != "b-0" {
		t.Fatalf("first record after restore %q, want b-0", v)
	}
	if err := c.CommitRecords(ctx, fresh...); err != nil {
		t.Fatal(err)
	}
	if err := c.CommitRecords(ctx, old[3]); err != nil { // late, from before the checkpoint
		t.Fatal(err)
	}
	offs := fetchCommitted(t, ctx, addrs, "mg")
	if o, _ := offs.Lookup("m", 0); o.At != 15 {
		t.Errorf("committed offset %d after a late commit, want 15", o.At)
	}
}

// With AutoCommitMarks the checkpoint commits the marked records only; the
// unmarked ones are delivered again after the restore.
func TestAutoCommitMarksAcrossRestore(t *testing.T) {
	addrs, reg := newRig(t, 1, "k")
	producePlain(t, addrs, "k", vals("a", 10))
	c := newHooked(t, reg, groupOpts(addrs, "kg", "k", kgo.AutoCommitMarks()))
	ctx := testCtx(t, 15*time.Second)
	var old []*kgo.Record
	for len(old) < 10 && ctx.Err() == nil {
		old = append(old, c.PollFetches(ctx).Records()...)
	}
	c.MarkCommitRecords(old[:6]...)
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	if n := res.Before[0].Details["partitions_committed"]; n != 1 {
		t.Errorf("partitions_committed = %v, want 1", n)
	}
	offs := fetchCommitted(t, ctx, addrs, "kg")
	if o, _ := offs.Lookup("k", 0); o.At != 6 {
		t.Errorf("committed offset %d, want 6 (the marked records)", o.At)
	}
	again := kafkatest.PollValues(ctx, c, nil, 4)
	if want := vals("a", 10)[6:]; !slices.Equal(again, want) {
		t.Errorf("after restore delivered %v, want %v", again, want)
	}
}
