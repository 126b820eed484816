package kafkahooks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

func testWriter(addrs []string, topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:            kafka.TCP(addrs...),
		Topic:           topic,
		RequiredAcks:    kafka.RequireAll,
		BatchSize:       20,
		BatchTimeout:    5 * time.Millisecond,
		WriteBackoffMin: 10 * time.Millisecond,
		WriteBackoffMax: 50 * time.Millisecond,
		WriteTimeout:    3 * time.Second,
		ReadTimeout:     3 * time.Second,
	}
}

// blockWatch follows the count of callers waiting at a gate through its
// onChange signal, so that a test waits for them without polling.
type blockWatch struct {
	blocked *watchedCount
	mu      sync.Mutex
	changed chan struct{} // closed at the next change of blocked
}

// watchBlocked sets the onChange of the gate's blocked count; call it
// before the first call through the gate.
func watchBlocked[S any, P gateView[S], R any](g *gate[S, P, R]) *blockWatch {
	b := &blockWatch{blocked: &g.blocked, changed: make(chan struct{})}
	g.blocked.onChange = func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		close(b.changed)
		b.changed = make(chan struct{})
	}
	return b
}

// reached waits up to d until n callers wait at the gate; for hooks, which
// must not call t.Fatal.
func (b *blockWatch) reached(n int64, d time.Duration) bool {
	timeout := time.After(d)
	for {
		b.mu.Lock()
		changed := b.changed
		b.mu.Unlock()
		if b.blocked.Load() == n {
			return true
		}
		select {
		case <-changed:
		case <-timeout:
			return false
		}
	}
}

// TestWriterCycles writes numbered records from several goroutines while a
// checkpoint→restore and a checkpoint→resume are simulated. Every record
// whose WriteMessages returned nil must be on the topic; calls that started
// while the gate was closed must block and then succeed; no connection to
// the broker may survive the before-checkpoint phase; the client id seen by
// the broker must change on Restore and not on Resume.
func TestWriterCycles(t *testing.T) {
	k := newFake(t, 3, "w")
	reg := notify.NewRegistry()
	log, _ := newLog(t)

	const writers = 8
	// phase is odd while the probe holds a checkpoint's gate closed: a call
	// that saw it change from even through odd to even again was blocked
	// across a checkpoint.
	var phase atomic.Int64
	var connsAtDump []int
	var w *Writer
	var watch *blockWatch
	hook(reg, func(ctx context.Context) error {
		// Runs after the writer's hook: the gate is closed, connections gone.
		phase.Add(1)
		defer phase.Add(1)
		connsAtDump = append(connsAtDump, established(t, k.port))
		// Hold the gate closed until every writer waits at it.
		if !watch.reached(writers, 5*time.Second) {
			return fmt.Errorf("%d of %d writers blocked at the gate", w.blocked.Load(), writers)
		}
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		return nil
	})
	w = NewWriter(testWriter(k.addrs, "w"), WithRegistry(reg), WithName("w"), WithLogger(log), WithClientID("svc"))
	watch = watchBlocked(&w.gate)
	defer w.Close()

	var (
		mu             sync.Mutex
		acked          = map[string]bool{}
		duringGate     int
		duringGateFail int
		failures       []error
	)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				v := fmt.Sprintf("%d-%d", g, i)
				p0 := phase.Load()
				err := w.WriteMessages(context.Background(), kafka.Message{Key: []byte(v), Value: []byte(v)})
				p1 := phase.Load()
				across := p1%2 == 0 && (p1 >= p0+2 || (p0%2 == 1 && p1 > p0))
				mu.Lock()
				if err == nil {
					acked[v] = true
				} else {
					failures = append(failures, err)
				}
				if across {
					duringGate++
					if err != nil {
						duringGateFail++
					}
				}
				mu.Unlock()
			}
		}()
	}

	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	waitFor(t, 10*time.Second, "first records", func() bool { return ackedCount() > 200 })
	if ids := k.sniff.since(0, keyProduce); len(ids) != 1 || ids["svc"] == 0 {
		t.Fatalf("client ids before any checkpoint = %v, want only svc", ids)
	}

	// Checkpoint → restore.
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	rep := decodeReport[WriterReport](t, res.Before[0].Details) // the writer's hook runs first
	if res.Before[0].Name != "w" || rep.WriterCheckpoint == nil || !rep.Drained || rep.RecordsCarried != 0 {
		t.Fatalf("before report = %s %+v", res.Before[0].Name, rep)
	}
	if rep.CallersBlocked == 0 {
		t.Errorf("report: no caller blocked at the gate: %v", rep)
	}
	wantID := "svc-" + res.Event.InstanceID[:8]
	if got := w.ClientID(); got != wantID {
		t.Fatalf("ClientID after restore = %q, want %q", got, wantID)
	}
	mark := k.sniff.mark()
	n := ackedCount()
	waitFor(t, 10*time.Second, "records after restore", func() bool { return ackedCount() > n+200 })
	if ids := k.sniff.since(mark, keyProduce); len(ids) != 1 || ids[wantID] == 0 {
		t.Fatalf("client ids after restore = %v, want only %s", ids, wantID)
	}

	// Checkpoint → resume: identity unchanged.
	res = hooktest.SimulateOK(t, context.Background(), reg, notify.SimResume, 5*time.Second)
	mark = k.sniff.mark()
	n = ackedCount()
	waitFor(t, 10*time.Second, "records after resume", func() bool { return ackedCount() > n+200 })
	if ids := k.sniff.since(mark, keyProduce); len(ids) != 1 || ids[wantID] == 0 {
		t.Fatalf("client ids after resume = %v, want only %s", ids, wantID)
	}
	stop()
	wg.Wait()

	for i, c := range connsAtDump {
		if c != 0 {
			t.Errorf("cycle %d: %d connections to the broker still established after the before-checkpoint hooks", i, c)
		}
	}
	if len(failures) > 0 {
		t.Fatalf("%d WriteMessages calls failed, first: %v", len(failures), failures[0])
	}
	if duringGate == 0 {
		t.Fatal("no WriteMessages call was blocked across a checkpoint")
	}
	if duringGateFail > 0 {
		t.Fatalf("%d calls blocked across a checkpoint failed", duringGateFail)
	}
	t.Logf("%d records acked, %d calls blocked across a checkpoint", len(acked), duringGate)

	onTopic := map[string]int{}
	for _, r := range kafkatest.ReadTopic(t, k.addrs, "w") {
		onTopic[string(r.Value)]++
	}
	missing := 0
	for v := range acked {
		if onTopic[v] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged records are not on the topic", missing, len(acked))
	}
}

// TestWriterAsyncCompletions checks that every Completion of an Async writer
// is delivered before its BeforeCheckpoint returns, even for records that sat
// in a batch waiting for BatchTimeout, and that none is lost.
func TestWriterAsyncCompletions(t *testing.T) {
	k := newFake(t, 2, "a")
	reg := notify.NewRegistry()
	log, _ := newLog(t)

	var completed, failed atomic.Int64
	var atDump int64 = -1
	hook(reg, func(ctx context.Context) error {
		atDump = completed.Load()
		return nil
	}, nil)
	tmpl := testWriter(k.addrs, "a")
	tmpl.Async = true
	tmpl.BatchSize = 1000
	tmpl.BatchTimeout = time.Hour // only the checkpoint's flush sends them
	tmpl.Completion = func(msgs []kafka.Message, err error) {
		if err != nil {
			failed.Add(int64(len(msgs)))
			return
		}
		completed.Add(int64(len(msgs)))
	}
	w := NewWriter(tmpl, WithRegistry(reg), WithLogger(log))
	defer w.Close()

	const n = 500
	for i := range n {
		v := strconv.Itoa(i)
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	if r, c := w.records(), completed.Load(); r != n || c != 0 {
		t.Fatalf("%d records pending and %d completed before the checkpoint; the test wants all %d buffered", r, c, n)
	}
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	if atDump != n || failed.Load() != 0 {
		t.Fatalf("completions when the before phase ended = %d (failed %d), want %d", atDump, failed.Load(), n)
	}
	rep := decodeReport[WriterReport](t, res.Before[0].Details)
	if rep.WriterCheckpoint == nil || rep.RecordsDrained != int64(n) || rep.RecordsCarried != 0 {
		t.Fatalf("report = %+v", rep)
	}
	// And the writer keeps working after restore.
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if got := len(kafkatest.ReadTopic(t, k.addrs, "a")); got != n+1 {
		t.Fatalf("%d records on the topic, want %d", got, n+1)
	}
}

// blockProduce makes the fake broker hold every produce request while
// blocked is set, until release is called: a broker too slow to drain within
// the checkpoint budget.
type blockProduce struct {
	blocked  atomic.Bool
	mu       sync.Mutex
	released chan struct{}
	heldOne  chan struct{} // closed when the first request is held
	once     sync.Once
}

func newBlockProduce(c *kfake.Cluster) *blockProduce {
	b := &blockProduce{released: make(chan struct{}), heldOne: make(chan struct{})}
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if b.blocked.Load() {
			b.mu.Lock()
			ch := b.released
			b.mu.Unlock()
			b.once.Do(func() { close(b.heldOne) })
			c.SleepControl(func() { <-ch })
		}
		return nil, nil, false
	})
	return b
}

func (b *blockProduce) block() {
	b.mu.Lock()
	b.released = make(chan struct{})
	b.mu.Unlock()
	b.blocked.Store(true)
}

// waitHeld waits up to d until the broker holds a produce request.
func (b *blockProduce) waitHeld(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-b.heldOne:
	case <-time.After(d):
		t.Fatalf("no produce request held by the broker within %v", d)
	}
}

func (b *blockProduce) release() {
	b.blocked.Store(false)
	b.mu.Lock()
	close(b.released)
	b.mu.Unlock()
}

// TestWriterCarryAcross makes draining impossible within the budget: the
// broker holds produce requests. BeforeCheckpoint must return within its
// budget, report the carried records, log a warning and leave no connection;
// after the restore (broker answering again) every record is delivered, in
// order, and every Completion reports success.
func TestWriterCarryAcross(t *testing.T) {
	k := newFake(t, 1, "c")
	bp := newBlockProduce(k.c)
	reg := notify.NewRegistry()
	log, sink := newLog(t)

	var conns = -1
	var w *Writer
	var watch *blockWatch
	gateClosed := make(chan struct{})   // the probe's before hook runs: the writer's gate is closed
	deadlineDone := make(chan struct{}) // the write with a deadline has returned
	hook(reg, func(ctx context.Context) error {
		conns = established(t, k.port)
		close(gateClosed)
		select {
		case <-deadlineDone:
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("the write with a deadline never returned")
		}
	}, func(ctx context.Context, ev notify.Event) error {
		// The sync caller waits at the gate, which opens in the writer's
		// after-restore hook, after this one.
		if !watch.reached(1, 5*time.Second) {
			return errors.New("no caller blocked at the gate")
		}
		bp.release() // the broker is back before the writer's after-restore hook
		return nil
	})
	var completed, failed atomic.Int64
	tmpl := testWriter(k.addrs, "c")
	tmpl.Async = true
	tmpl.BatchSize = 20
	tmpl.Completion = func(msgs []kafka.Message, err error) {
		if err != nil {
			failed.Add(int64(len(msgs)))
			t.Errorf("completion error: %v", err)
			return
		}
		completed.Add(int64(len(msgs)))
	}
	w = NewWriter(tmpl, WithRegistry(reg), WithLogger(log), WithRetryBackoff(10*time.Millisecond, 100*time.Millisecond))
	watch = watchBlocked(&w.gate)
	defer w.Close()
	// Warm up metadata so that the first batch is on the wire when blocked.
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("-1")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "warm-up record", func() bool { return completed.Load() == 1 })

	bp.block()
	const n = 200
	for i := range n {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	bp.waitHeld(t, 5*time.Second)

	// A sync caller blocked at the gate, with and without a deadline.
	syncW := make(chan error, 1)
	go func() {
		<-gateClosed
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("deadline")}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("write with deadline during the checkpoint: %v, want DeadlineExceeded", err)
		}
		close(deadlineDone)
		syncW <- w.WriteMessages(context.Background(), kafka.Message{Value: []byte(strconv.Itoa(n))})
	}()

	const budget = time.Second
	start := time.Now()
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, budget)
	before := res.Before[0]
	if before.Duration > budget+100*time.Millisecond {
		t.Errorf("before-checkpoint took %v with a budget of %v", before.Duration, budget)
	}
	rep := decodeReport[WriterReport](t, before.Details)
	if rep.WriterCheckpoint == nil || rep.Drained || rep.RecordsCarried <= 0 {
		t.Fatalf("before report = %+v, want records carried", rep)
	}
	if conns != 0 {
		t.Errorf("%d connections to the broker established after the before phase", conns)
	}
	if sink.count(slog.LevelWarn) == 0 {
		t.Error("no warning logged for carried records")
	}
	after := decodeReport[WriterReport](t, res.After[len(res.After)-1].Details)
	if after.WriterRestore == nil || !after.GateOpen {
		t.Fatalf("after report = %+v, want the gate open", after)
	}
	if err := <-syncW; err != nil {
		t.Fatalf("sync write blocked during the checkpoint: %v", err)
	}
	w.Close()
	t.Logf("cycle took %v; before %v; after %v", time.Since(start), rep, after)

	if c := completed.Load(); c != n+2 || failed.Load() != 0 {
		t.Fatalf("completions %d (failed %d), want %d", c, failed.Load(), n+2)
	}
	// First occurrences on the partition are in write order; duplicates of
	// the request that was on the wire are allowed.
	seen := map[string]bool{}
	var order []int
	for _, r := range kafkatest.ReadTopic(t, k.addrs, "c") {
		if v := string(r.Value); !seen[v] {
			seen[v] = true
			if i, err := strconv.Atoi(v); err == nil && i >= 0 && i < n {
				order = append(order, i)
			}
		}
	}
	if len(order) != n {
		t.Fatalf("%d distinct records of %d on the topic", len(order), n)
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("record %d on the topic is %d: order broken (%v…)", i, v, order[max(0, i-3):min(len(order), i+3)])
		}
	}
}

// TestWriterBrokerDownAfterRestore: the broker still holds produce requests
// after the restore. The after-restore hook must return when its budget
// ends, while the broker still holds them, with the gate still closed (new
// writes block, a write with a deadline fails with it), and the writer must
// deliver the carried records and open the gate by itself once the broker
// answers.
func TestWriterBrokerDownAfterRestore(t *testing.T) {
	k := newFake(t, 1, "d")
	bp := newBlockProduce(k.c)
	reg := notify.NewRegistry()
	log, sink := newLog(t)
	tmpl := testWriter(k.addrs, "d")
	tmpl.BatchSize = 1
	w := NewWriter(tmpl, WithRegistry(reg), WithLogger(log), WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	defer w.Close()
	watch := watchBlocked(&w.gate)
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("warm")}); err != nil {
		t.Fatal(err)
	}

	bp.block()
	first := make(chan error, 1)
	go func() { first <- w.WriteMessages(context.Background(), kafka.Message{Value: []byte("carried")}) }()
	bp.waitHeld(t, 5*time.Second)

	// The cycle ends while the broker is still down: the hook gave up at
	// the end of its budget instead of waiting for the broker. (The bound
	// only keeps a failing run from hanging.)
	type cycle struct {
		res notify.SimResult
		err error
	}
	done := make(chan cycle, 1)
	go func() {
		res, err := reg.Simulate(context.Background(), notify.SimRestore, 300*time.Millisecond)
		done <- cycle{res, err}
	}()
	var res notify.SimResult
	select {
	case c := <-done:
		if c.err != nil || c.res.BeforeErr != nil || c.res.AfterErr != nil {
			t.Fatalf("simulate: %v, before %v, after %v", c.err, c.res.BeforeErr, c.res.AfterErr)
		}
		res = c.res
	case <-time.After(30 * time.Second):
		bp.release()
		t.Fatal("the after-restore hook waited for the broker past its budget")
	}
	after := decodeReport[WriterReport](t, res.After[0].Details)
	if after.WriterRestore == nil || after.GateOpen || after.RecordsCarried != 1 || after.RecordsDelivered != 0 {
		t.Fatalf("after report = %v, want 1 record carried, none delivered, the gate still closed", res.After[0].Details)
	}
	if !sink.has(slog.LevelWarn, "within the after-restore budget") {
		t.Error("no warning that the carried records were not delivered within the budget")
	}
	if v, ok := sink.attr(slog.LevelWarn, "within the after-restore budget", "cause"); !ok || v.Any() == nil {
		t.Errorf("the budget warning's cause = %v, want why the wait ended", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := w.WriteMessages(ctx, kafka.Message{Value: []byte("deadline")})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("write with deadline while resending: %v, want DeadlineExceeded", err)
	}
	blocked := make(chan error, 1)
	go func() { blocked <- w.WriteMessages(context.Background(), kafka.Message{Value: []byte("blocked")}) }()
	if !watch.reached(1, 5*time.Second) {
		t.Fatal("a write while resending did not wait at the gate")
	}
	select {
	case err := <-first:
		t.Fatalf("carried write returned %v before the broker answered", err)
	case err := <-blocked:
		t.Fatalf("write returned %v while the gate was closed", err)
	default:
	}

	bp.release()
	for _, ch := range []chan error{first, blocked} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("write still blocked after the broker came back")
		}
	}
	w.Close()
	seen := map[string]bool{}
	for _, r := range kafkatest.ReadTopic(t, k.addrs, "d") {
		seen[string(r.Value)] = true
	}
	if !seen["carried"] || !seen["blocked"] {
		t.Fatalf("records on the topic: %v", seen)
	}
}
