package kgohooks

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/notify"
)

func TestOpenTxnAbortedAtCheckpoint(t *testing.T) {
	addrs, reg := newRig(t, 1, "t")
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx")})
	ctx := testCtx(t, 15*time.Second)
	runTxn(t, ctx, c, "c", 5, true)
	runTxn(t, ctx, c, "open", 5, false)

	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, time.Second)
	if got := res.Before[0].Details["transaction"]; got != "aborted" {
		t.Errorf("report transaction = %v, want aborted", got)
	}
	if err := c.EndTransaction(ctx, kgo.TryCommit); !errors.Is(err, ErrTxnAbortedByCheckpoint) {
		t.Errorf("EndTransaction of the aborted transaction = %v, want ErrTxnAbortedByCheckpoint", err)
	}
	if id := c.TransactionalID(); !strings.HasPrefix(id, "tx-") || len(id) != len("tx-")+8 {
		t.Errorf("transactional id after restore = %q, want tx-<8 hex>", id)
	}
	runTxn(t, ctx, c, "n", 5, true)

	wantCommitted(t, addrs, "t", slices.Concat(vals("c", 5), vals("n", 5)))
}

func TestFailOnOpenTxnRefusesAndKeepsTxn(t *testing.T) {
	addrs, reg := newRig(t, 1, "t")
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx")}, WithOpenTxnPolicy(FailOnOpenTxn))
	ctx := testCtx(t, 15*time.Second)
	runTxn(t, ctx, c, "k", 3, false)
	pid0, _, _ := c.ProducerID(ctx)
	hooktest.SimulateRefused(t, ctx, reg, time.Second, ErrOpenTxn)
	if id := c.TransactionalID(); id != "tx" {
		t.Errorf("transactional id after a refused checkpoint = %q, want tx", id)
	}
	// The application is still inside its transaction, on the same client.
	if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte("k-3")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit after the refused checkpoint: %v", err)
	}
	if pid1, _, _ := c.ProducerID(ctx); pid1 != pid0 {
		t.Errorf("producer id changed from %d to %d by a refused checkpoint", pid0, pid1)
	}
	want := vals("k", 4)
	wantCommitted(t, addrs, "t", want)
}

// CommitOpenTxn commits the open transaction before the dump; KeepTxnID
// keeps the transactional id after a restore.
func TestCommitOpenTxnKeepTxnID(t *testing.T) {
	addrs, reg := newRig(t, 1, "t")
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx")}, WithOpenTxnPolicy(CommitOpenTxn), WithTxnIDPolicy(KeepTxnID))
	ctx := testCtx(t, 15*time.Second)
	if err := c.BeginTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	for _, v := range vals("o", 3) {
		c.Produce(ctx, &kgo.Record{Value: []byte(v)}, nil)
	}
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, time.Second)
	if got := res.Before[0].Details["transaction"]; got != "committed" {
		t.Errorf("report transaction = %v, want committed", got)
	}
	if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Errorf("EndTransaction of the transaction the checkpoint committed = %v, want nil", err)
	}
	if id := c.TransactionalID(); id != "tx" {
		t.Errorf("transactional id after restore with KeepTxnID = %q, want tx", id)
	}
	if id := c.ClientID(); id == "kgo" {
		t.Errorf("client id %q not suffixed after restore", id)
	}
	if err := c.BeginTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte("o-3")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	want := vals("o", 4)
	wantCommitted(t, addrs, "t", want)
}

// The application may end its open transaction itself while the hook
// waits, with kgo's sequence Produce, Flush, EndTransaction: these calls
// pass the closed gate.
func TestAppEndsTxnDuringCheckpoint(t *testing.T) {
	addrs, reg := newRig(t, 1, "t")
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx")})
	ctx := testCtx(t, 15*time.Second)
	if err := c.BeginTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	c.Produce(ctx, &kgo.Record{Value: []byte("e-0")}, nil)
	ended := make(chan error, 1)
	go func() {
		for c.state.Load().gate == nil {
			time.Sleep(time.Millisecond)
		}
		c.Produce(ctx, &kgo.Record{Value: []byte("e-1")}, nil)
		if err := c.Flush(ctx); err != nil {
			ended <- err
			return
		}
		ended <- c.EndTransaction(ctx, kgo.TryCommit)
	}()
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 4*time.Second)
	if err := <-ended; err != nil {
		t.Fatalf("the application's commit during the checkpoint: %v", err)
	}
	if got := res.Before[0].Details["transaction"]; got != "none" {
		t.Errorf("report transaction = %v, want none (the application ended it)", got)
	}
	if d := res.Before[0].Duration; d > time.Second {
		t.Errorf("before hook took %v: it waited for a transaction the application had ended", d)
	}
	want := vals("e", 2)
	wantCommitted(t, addrs, "t", want)
}

// TryProduce goes through the same gate as Produce: it delivers, and after a
// checkpoint aborted the open transaction it fails like Produce.
func TestTryProduceGatedLikeProduce(t *testing.T) {
	addrs, reg := newRig(t, 1, "t")
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx")})
	ctx := testCtx(t, 15*time.Second)
	if err := c.BeginTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	tryProduce := func(v string) error {
		done := make(chan error, 1)
		c.TryProduce(ctx, &kgo.Record{Value: []byte(v)}, func(_ *kgo.Record, err error) { done <- err })
		return <-done
	}
	if err := tryProduce("y-0"); err != nil {
		t.Fatal(err)
	}
	hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, time.Second)
	if err := tryProduce("y-1"); !errors.Is(err, ErrTxnAbortedByCheckpoint) {
		t.Errorf("TryProduce in the aborted transaction = %v, want ErrTxnAbortedByCheckpoint", err)
	}
	if err := c.EndTransaction(ctx, kgo.TryCommit); !errors.Is(err, ErrTxnAbortedByCheckpoint) {
		t.Errorf("EndTransaction = %v, want ErrTxnAbortedByCheckpoint", err)
	}
	runTxn(t, ctx, c, "z", 2, false)
	if err := tryProduce("z-2"); err != nil {
		t.Fatal(err)
	}
	if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	wantCommitted(t, addrs, "t", vals("z", 3))
}
