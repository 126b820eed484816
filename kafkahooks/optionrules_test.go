package kafkahooks

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// Regression tests for the holes a review found: records skipped, committed
// records delivered again, and a Writer wedged by a checkpoint.

// TestCompletionWritesSameWriter is the retry / dead-letter pattern: the
// Completion of an async Writer writes to the same Writer (every "a-N" is
// followed by a "b-N"), also while a checkpoint is closing the Writer. The
// Writer must not wedge: a write soon after the restore succeeds, and every
// "b-N" follows its "a-N" on the topic.
func TestCompletionWritesSameWriter(t *testing.T) {
	k := newFake(t, 2, "re")
	reg := notify.NewRegistry()
	log, _ := newLog(t)

	var w *Writer
	var cbErrs, followed atomic.Int64
	tmpl := testWriter(k.addrs, "re")
	tmpl.Async = true
	tmpl.Completion = func(msgs []kafka.Message, err error) {
		if err != nil {
			cbErrs.Add(1)
			return
		}
		for _, m := range msgs {
			if v := string(m.Value); strings.HasPrefix(v, "a-") {
				if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("b-" + v[2:])}); err != nil {
					cbErrs.Add(1)
				}
			} else if strings.HasPrefix(v, "b-") {
				followed.Add(1)
			}
		}
	}
	w = NewWriter(tmpl, WithRegistry(reg), WithLogger(log))
	defer w.Close()

	ctx, stop := context.WithCancel(context.Background())
	var sent atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("a-" + strconv.Itoa(i))}); err != nil {
				return
			}
			sent.Add(1)
			time.Sleep(200 * time.Microsecond)
		}
	}()
	waitFor(t, 5*time.Second, "records flowing", func() bool { return sent.Load() > 200 })

	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 2*time.Second)
	wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	err := w.WriteMessages(wctx, kafka.Message{Value: []byte("after")})
	cancel()
	if err != nil {
		t.Fatalf("write 0-3 s after the restore: %v (report %v / %v)", err, res.Before[0].Details, res.After[0].Details)
	}
	n := sent.Load()
	waitFor(t, 5*time.Second, "records flowing after the restore", func() bool { return sent.Load() > n+200 })
	stop()
	<-done
	waitFor(t, 10*time.Second, "every follow-up acknowledged", func() bool { return followed.Load() == sent.Load() })
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if cbErrs.Load() != 0 {
		t.Fatalf("%d completion errors", cbErrs.Load())
	}
	seen := map[string]bool{}
	for _, r := range kafkatest.ReadTopic(t, k.addrs, "re") {
		seen[string(r.Value)] = true
	}
	total := sent.Load()
	for i := range total {
		s := strconv.FormatInt(i, 10)
		if !seen["a-"+s] || !seen["b-"+s] {
			t.Fatalf("record %d: a on topic %v, b on topic %v (of %d)", i, seen["a-"+s], seen["b-"+s], total)
		}
	}
	t.Logf("%d records and their follow-ups on the topic; before %v", total, res.Before[0].Details)
}

// TestCompletionCallsOtherResources: the Completion of an async Writer A
// writes to a sync Writer B and commits to a group Reader, both registered
// after A (so their gates close first and open last). Neither A's hooks nor
// the calls may wedge: A drains within a fraction of the budget, and after
// the restore everything completes.
func TestCompletionCallsOtherResources(t *testing.T) {
	k := newFake(t, 1, "src", "dst")
	reg := notify.NewRegistry()
	log, _ := newLog(t)

	src := NewWriter(testWriter(k.addrs, "src"), WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer src.Close()
	var msgs []kafka.Message
	for i := range 50 {
		msgs = append(msgs, kafka.Message{Value: []byte(strconv.Itoa(i))})
	}
	if err := src.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}

	var (
		b       *Writer
		r       *Reader
		mu      sync.Mutex
		handled = map[int64]bool{}
		cbErr   atomic.Value
	)
	atmpl := testWriter(k.addrs, "dst")
	atmpl.Async = true
	atmpl.BatchSize = 1
	atmpl.Completion = func(out []kafka.Message, err error) {
		if err != nil {
			cbErr.Store(err)
			return
		}
		for _, m := range out {
			if err := b.WriteMessages(context.Background(), kafka.Message{Value: append([]byte("copy-"), m.Value...)}); err != nil {
				cbErr.Store(err)
			}
			off, _ := strconv.ParseInt(string(m.Headers[0].Value), 10, 64)
			if err := r.CommitMessages(context.Background(), kafka.Message{Topic: "src", Partition: 0, Offset: off}); err != nil {
				cbErr.Store(err)
			}
			mu.Lock()
			handled[off] = true
			mu.Unlock()
		}
	}
	a := NewWriter(atmpl, WithRegistry(reg), WithName("A"), WithLogger(log))
	defer a.Close()
	b = NewWriter(testWriter(k.addrs, "dst"), WithRegistry(reg), WithName("B"), WithLogger(log))
	defer b.Close()
	r = NewReader(groupConfig(k.addrs, "cg", "src", "r"), WithRegistry(reg), WithName("R"), WithLogger(log))
	defer r.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sim := make(chan notify.SimResult, 1)
	// After the restore the group redelivers what was not committed: fetch
	// until every offset went through A.
	fetched := map[int64]bool{}
	for i := 0; len(fetched) < 50; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fetched[m.Offset] = true
		if err := a.WriteMessages(ctx, kafka.Message{Value: m.Value, Headers: []kafka.Header{{Key: "o", Value: []byte(strconv.FormatInt(m.Offset, 10))}}}); err != nil {
			t.Fatal(err)
		}
		if i == 25 {
			go func() {
				res, err := reg.Simulate(context.Background(), notify.SimRestore, 3*time.Second)
				if err != nil {
					t.Error(err)
				}
				sim <- res
			}()
		}
	}
	res := <-sim
	if res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("hooks: %v %v", res.BeforeErr, res.AfterErr)
	}
	for _, rep := range append(res.Before, res.After...) {
		if rep.Name == "A" && rep.Duration > time.Second {
			t.Errorf("A's hook took %v of a 3 s budget: it waited for calls blocked at other gates (%v)", rep.Duration, rep.Details)
		}
	}
	waitFor(t, 10*time.Second, "every completion handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 50
	})
	if e := cbErr.Load(); e != nil {
		t.Fatalf("a call from a completion failed: %v", e)
	}
}

// TestPartitionReaderSymbolicOffset: a partition Reader after
// SetOffset(LastOffset) that has handed out nothing yet must continue, after
// a restore, at the offset LastOffset resolved to before the checkpoint: the
// records prefetched, produced during the checkpoint and produced before the
// first fetch after the restore are all delivered.
func TestPartitionReaderSymbolicOffset(t *testing.T) {
	const topic = "sym"
	k := newFake(t, 1, topic)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	write := seqWriter(t, k.addrs, topic, log)
	write(0, 5)
	hook(reg, func(context.Context) error { write(8, 10); return nil }, nil)
	r := NewReader(kafka.ReaderConfig{Brokers: k.addrs, Topic: topic, MaxWait: 50 * time.Millisecond},
		WithRegistry(reg), WithLogger(log))
	defer r.Close()
	if err := r.SetOffset(kafka.LastOffset); err != nil {
		t.Fatal(err)
	}
	// A fetch that times out: the reader is tailing from offset 5.
	fctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if m, err := r.FetchMessage(fctx); err == nil {
		t.Fatalf("fetch at the end returned offset %d", m.Offset)
	}
	cancel()
	write(5, 8) // prefetched, not handed out
	time.Sleep(300 * time.Millisecond)

	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	write(10, 12) // before the first fetch after the restore
	for want := int64(5); want < 12; want++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := r.FetchMessage(ctx)
		cancel()
		if err != nil {
			t.Fatalf("fetching offset %d: %v (before report %v)", want, err, res.Before[0].Details)
		}
		if m.Offset != want {
			t.Fatalf("got offset %d, want %d: records skipped (before report %v)", m.Offset, want, res.Before[0].Details)
		}
	}
}

// TestGroupReaderLastOffsetNoCommit: a new group starting at LastOffset, on a
// partition with no committed offset. Records it handed out and prefetched,
// and records produced during the checkpoint, must all be delivered after
// the restore (handed-out ones may come again: at-least-once).
func TestGroupReaderLastOffsetNoCommit(t *testing.T) {
	const topic, group = "glo", "glog"
	k := newFake(t, 1, topic)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	write := seqWriter(t, k.addrs, topic, log)
	write(0, 5)
	hook(reg, func(context.Context) error { write(12, 14); return nil }, nil)
	c := groupConfig(k.addrs, group, topic, "glo")
	c.StartOffset = kafka.LastOffset
	r := NewReader(c, WithRegistry(reg), WithLogger(log))
	defer r.Close()
	// Wait until the reader has joined and resolved LastOffset (5).
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if m, err := r.FetchMessage(fctx); err == nil {
		t.Fatalf("fetch at the end returned offset %d", m.Offset)
	}
	cancel()
	write(5, 12)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for want := int64(5); want < 7; want++ {
		m, err := r.FetchMessage(ctx)
		if err != nil || m.Offset != want {
			t.Fatalf("fetch: offset %d, %v; want %d", m.Offset, err, want)
		}
	}
	waitFor(t, 5*time.Second, "prefetched records", func() bool { return r.Stats().QueueLength > 0 })

	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	write(14, 16)
	got := map[int64]bool{}
	for len(got) < 16-7 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("after restore, delivered %v: %v (before report %v)", got, err, res.Before[0].Details)
		}
		if m.Offset < 5 {
			t.Fatalf("offset %d delivered: before the resolved start 5", m.Offset)
		}
		if m.Offset >= 7 {
			got[m.Offset] = true
		}
	}
}

// TestCommitIntervalFlushRetried: with CommitInterval, the commits pending
// at the checkpoint must reach the broker although the coordinator answers
// the first commit during the hooks with COORDINATOR_LOAD_IN_PROGRESS.
func TestCommitIntervalFlushRetried(t *testing.T) {
	const topic, group = "cif", "cifg"
	k := newFake(t, 1, topic)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	writeBatch(t, k.addrs, topic, log, 30)
	var failNext, failed atomic.Bool
	k.c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.c.KeepControl()
		if !failNext.Load() || failed.Load() {
			return nil, nil, false
		}
		failed.Store(true)
		return kafkatest.FailCommit(req, kerr.CoordinatorLoadInProgress.Code), nil, true
	})
	hook(reg, nil, nil)
	c := groupConfig(k.addrs, group, topic, "cif")
	c.CommitInterval = time.Hour // only the checkpoint flushes
	r := NewReader(c, WithRegistry(reg), WithLogger(log))
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	fetchCommitInOrder(t, ctx, r, 20)
	failNext.Store(true)
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	if !failed.Load() {
		t.Fatal("no commit was sent during the hooks")
	}
	m, err := r.FetchMessage(ctx)
	if err != nil || m.Offset != 20 {
		t.Fatalf("first fetch after restore: offset %d, %v; want 20 (before report %v)", m.Offset, err, res.Before[len(res.Before)-1].Details)
	}
}

// TestCarriedFatalError: records carried across a checkpoint whose topic is
// deleted meanwhile must not be resent forever. They fail, the error reaches
// their Completion and sync callers, and the gate opens.
func TestCarriedFatalError(t *testing.T) {
	k := newFake(t, 1, "gone")
	bp := newBlockProduce(k.c)
	adm := admin(t, k.addrs)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	hook(reg, func(ctx context.Context) error {
		_, err := adm.DeleteTopics(ctx, "gone")
		return err
	}, func(ctx context.Context, ev notify.Event) error {
		bp.release()
		return nil
	})
	var failed atomic.Int64
	var lastErr atomic.Value
	tmpl := testWriter(k.addrs, "gone")
	tmpl.Async = true
	tmpl.Completion = func(msgs []kafka.Message, err error) {
		if err != nil {
			lastErr.Store(err) // before the count a test waits on
			failed.Add(int64(len(msgs)))
		}
	}
	w := NewWriter(tmpl, WithRegistry(reg), WithLogger(log), WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	defer w.Close()
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	bp.block()
	for i := range 10 {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	bp.waitHeld(t, 5*time.Second)
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 500*time.Millisecond)
	if err != nil || res.BeforeErr != nil {
		t.Fatalf("simulate: %v %v", err, res.BeforeErr)
	}
	waitFor(t, 15*time.Second, "the carried records to fail", func() bool { return failed.Load() == 10 })
	t.Logf("carried records failed with: %v", lastErr.Load())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The gate is open again: the call returns (the topic is gone, so
	// kafka-go fails it or creates the topic, as without a checkpoint).
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("after")}); errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("write after the carried records failed: %v (the gate stayed closed)", err)
	}
}

// TestFatalResend: the errors that fail carried records instead of being
// retried.
func TestFatalResend(t *testing.T) {
	for _, c := range []struct {
		err   error
		fatal bool
	}{
		{kafka.TopicAuthorizationFailed, true},
		{kafka.SASLAuthenticationFailed, true},
		{fmt.Errorf("produce: %w", kafka.ClusterAuthorizationFailed), true},
		{x509.UnknownAuthorityError{}, true},
		{kafka.LeaderNotAvailable, false},
		{kafka.UnknownTopicOrPartition, false}, // only once the broker confirms it
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
	} {
		if got := fatalResend(c.err); got != c.fatal {
			t.Errorf("fatalResend(%v) = %v, want %v", c.err, got, c.fatal)
		}
	}
}

// TestAbandonedBeforeHook: notify gives up on a before-checkpoint hook that
// overruns its budget and runs the after-restore hooks. When the abandoned
// hook ends later, it must not close the connections or the transport that
// the after-restore hook installed.
func TestAbandonedBeforeHook(t *testing.T) {
	k := newFake(t, 1, "ab")
	bp := newBlockProduce(k.c)
	log, _ := newLog(t)
	w := NewWriter(testWriter(k.addrs, "ab"), WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer w.Close()
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	bp.block()
	go w.WriteMessages(context.Background(), kafka.Message{Value: []byte("held")})
	bp.waitHeld(t, 5*time.Second)

	bctx, overrun := context.WithCancel(context.Background()) // no deadline: the hook waits
	before := make(chan error, 1)
	go func() { before <- w.BeforeCheckpoint(bctx) }()
	time.Sleep(200 * time.Millisecond)
	// notify has given up on it: after-restore hooks run (the broker is
	// still slow, so the gate stays closed until it answers).
	actx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if err := w.AfterRestore(actx, notify.Event{Kind: notify.Resume}); err != nil {
		t.Fatal(err)
	}
	cancel()
	overrun() // the abandoned hook ends now
	if err := <-before; err != nil {
		t.Fatal(err)
	}
	bp.release()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("after")}); err != nil {
		t.Fatalf("write after the abandoned hook ended: %v", err)
	}
}
