package kgohooks

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Records produced, polled and committed through the Client count as
// activity on its registry; a poll that returns nothing does not.
func TestActivityCounts(t *testing.T) {
	addrs, reg := newRig(t, 1, "act")
	c := newHooked(t, reg, groupOpts(addrs, "actg", "act", kgo.DisableAutoCommit()))
	ctx := testCtx(t, 20*time.Second)
	if err := c.ProduceSync(ctx, &kgo.Record{Topic: "act", Value: []byte("a")}, &kgo.Record{Topic: "act", Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	c.Produce(ctx, &kgo.Record{Topic: "act", Value: []byte("c")}, func(_ *kgo.Record, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := reg.Activity().Count; n != 3 {
		t.Fatalf("after producing 3 records: count %d, want 3", n)
	}
	var got []*kgo.Record
	for len(got) < 3 && ctx.Err() == nil {
		fs := c.PollFetches(ctx)
		got = append(got, fs.Records()...)
	}
	if err := c.CommitRecords(ctx, got...); err != nil {
		t.Fatal(err)
	}
	if n := reg.Activity().Count; n != 9 {
		t.Fatalf("after polling and committing 3 records: count %d, want 9", n)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if fs := c.PollFetches(short); fs.NumRecords() != 0 {
		t.Fatalf("poll on a drained topic returned %d records", fs.NumRecords())
	}
	if n := reg.Activity().Count; n != 9 {
		t.Fatalf("an empty poll counted: %d, want 9", n)
	}
}
