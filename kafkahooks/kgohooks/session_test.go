package kgohooks

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// A consume-transform-produce loop with a transaction open at the
// checkpoint: the transaction is aborted, its input is polled again, and a
// read_committed reader of the output sees every input exactly once.
func TestSessionExactlyOnceAcrossRestore(t *testing.T) {
	addrs, reg := newRig(t, 1, "in", "out")
	producePlain(t, addrs, "in", vals("r", 20))
	s := newETLSession(t, addrs, reg)
	ctx := testCtx(t, 20*time.Second)

	// step begins a transaction, transforms up to 5 polled records, and
	// returns how many; end ends it.
	step := func() int {
		t.Helper()
		if err := s.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		fs := s.PollRecords(ctx, 5)
		for _, e := range fs.Errors() {
			t.Fatalf("poll: %v", e.Err)
		}
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			s.Produce(ctx, &kgo.Record{Value: append([]byte("out-"), r.Value...)}, func(_ *kgo.Record, err error) {
				if err != nil {
					t.Errorf("produce: %v", err)
				}
			})
		})
		return n
	}
	end := func() bool {
		t.Helper()
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		committed, err := s.End(ctx, kgo.TryCommit)
		if err != nil {
			t.Fatal(err)
		}
		return committed
	}
	done := 0
	for done < 5 {
		n := step()
		if end() {
			done += n
		}
	}
	if step() == 0 {
		t.Fatal("no records for the open transaction")
	}
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 2*time.Second)
	t.Logf("before report: %+v", res.Before[0].Details)
	if got := res.Before[0].Details["transaction"]; got != "aborted" {
		t.Errorf("report transaction = %v, want aborted", got)
	}
	if committed, err := s.End(ctx, kgo.TryCommit); committed || err != nil {
		t.Errorf("End of the aborted transaction = %v, %v; want false, nil", committed, err)
	}
	for done < 20 && ctx.Err() == nil {
		n := step()
		if end() {
			done += n
		}
	}
	want := outValues(vals("r", 20))
	got := kafkatest.ReadValues(t, addrs, "out", len(want), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("read_committed output has %d records, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

// The application ends its session transaction itself while the hook
// waits: Produce, Flush and End pass the gate and the transaction commits.
func TestSessionAppEndsTxnDuringCheckpoint(t *testing.T) {
	addrs, reg := newRig(t, 1, "in", "out")
	producePlain(t, addrs, "in", vals("r", 3))
	s := newETLSession(t, addrs, reg)
	ctx := testCtx(t, 15*time.Second)
	if err := s.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	var in []*kgo.Record
	for len(in) < 3 && ctx.Err() == nil {
		in = append(in, s.PollFetches(ctx).Records()...)
	}
	type result struct {
		committed bool
		err       error
	}
	ended := make(chan result, 1)
	go func() {
		for s.state.Load().gate == nil {
			time.Sleep(time.Millisecond)
		}
		for _, r := range in {
			s.Produce(ctx, &kgo.Record{Value: append([]byte("out-"), r.Value...)}, nil)
		}
		if err := s.Flush(ctx); err != nil {
			ended <- result{false, err}
			return
		}
		c, err := s.End(ctx, kgo.TryCommit)
		ended <- result{c, err}
	}()
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 4*time.Second)
	if r := <-ended; !r.committed || r.err != nil {
		t.Fatalf("End during the checkpoint = %v, %v; want committed", r.committed, r.err)
	}
	if got := res.Before[0].Details["transaction"]; got != "none" {
		t.Errorf("report transaction = %v, want none", got)
	}
	want := outValues(vals("r", 3))
	if got := kafkatest.ReadValues(t, addrs, "out", len(want), kgo.FetchIsolationLevel(kgo.ReadCommitted())); !slices.Equal(got, want) {
		t.Errorf("read_committed output %v, want %v", got, want)
	}
	// Committed with the transaction: the restored member polls nothing old.
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer pcancel()
	if n := s.PollFetches(pctx).NumRecords(); n != 0 {
		t.Errorf("restored member got %d input records again", n)
	}
}

// newETLSession returns a session that reads "in" in group etl and writes
// "out" in transactions, hooked into reg and closed at the end of the test.
func newETLSession(t *testing.T, addrs []string, reg *notify.Registry) *GroupTransactSession {
	t.Helper()
	s, err := NewSession(groupOpts(addrs, "etl", "in", kgo.TransactionalID("etl"), kgo.DefaultProduceTopic("out"),
		kgo.RequireStableFetchOffsets()), WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// outValues returns the values the transform writes for inputs.
func outValues(inputs []string) []string {
	out := make([]string, len(inputs))
	for i, v := range inputs {
		out[i] = "out-" + v
	}
	return out
}
