package kafkahooks

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/notify"
)

func groupConfig(addrs []string, group, topic, clientID string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:           addrs,
		GroupID:           group,
		Topic:             topic,
		Dialer:            &kafka.Dialer{ClientID: clientID, Timeout: 5 * time.Second},
		StartOffset:       kafka.FirstOffset,
		HeartbeatInterval: 50 * time.Millisecond,
		// Long: a member that does not leave the group on Close would keep
		// its partitions for this long.
		SessionTimeout:   30 * time.Second,
		RebalanceTimeout: 2 * time.Second,
		JoinGroupBackoff: 50 * time.Millisecond,
		MaxWait:          100 * time.Millisecond,
		ReadBackoffMin:   10 * time.Millisecond,
		ReadBackoffMax:   50 * time.Millisecond,
		QueueCapacity:    50,
		MaxAttempts:      10,
	}
}

func admin(t testing.TB, addrs []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// members returns the client ids of the group's members and the partitions
// each one is assigned.
func members(ctx context.Context, adm *kadm.Client, group string) map[string][]int32 {
	out := map[string][]int32{}
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil
	}
	g, ok := gs[group]
	if !ok || g.Err != nil || g.State != "Stable" {
		return nil
	}
	for _, m := range g.Members {
		var ps []int32
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				ps = append(ps, t.Partitions...)
			}
		}
		out[m.ClientID] = ps
	}
	return out
}

// TestReaderGroup runs two group readers, A and B, over a topic that keeps
// receiving records. A is checkpointed while it is busy: while its
// checkpoint is under way B must own every partition (A left the group);
// after the restore A rejoins with a new client id. Committed offsets must
// never go backwards and every record must be processed at least once.
//
// kafka-go by itself can move an offset back when a plain rebalance happens
// between a FetchMessage and its CommitMessages (the commit goes out with the
// new generation, for a partition another member may have advanced). That is
// not what this test is about, so no records are produced while the group
// forms and while A rejoins: at those rebalances no record is in flight.
func TestReaderGroup(t *testing.T) {
	const topic, group, parts = "g", "grp", 4
	k := newFake(t, parts, topic)
	adm := admin(t, k.addrs)
	regA, regB := notify.NewRegistry(), notify.NewRegistry()
	log, _ := newLog(t)

	var (
		mu        sync.Mutex
		processed = map[string]int{}
		produced  atomic.Int64
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Producer: a record every 2ms while producing is on.
	prod := NewWriter(&kafka.Writer{Addr: kafka.TCP(k.addrs...), Topic: topic, BatchSize: 1, RequiredAcks: kafka.RequireAll},
		WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer prod.Close()
	var producing atomic.Bool
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		for i := 0; ctx.Err() == nil; {
			if !producing.Load() {
				time.Sleep(time.Millisecond)
				continue
			}
			if err := prod.WriteMessages(ctx, kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
				return
			}
			i++
			produced.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	allProcessed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range produced.Load() {
			if processed[strconv.FormatInt(i, 10)] == 0 {
				return false
			}
		}
		return true
	}
	// quiet stops producing and waits until every record was processed
	// and every partition's commit reached its end offset.
	quiet := func(ctx context.Context) bool {
		producing.Store(false)
		time.Sleep(10 * time.Millisecond) // a write in progress
		for ctx.Err() == nil {
			if allProcessed() {
				ends, err1 := adm.ListEndOffsets(ctx, topic)
				offs, err2 := adm.FetchOffsets(ctx, group)
				if err1 == nil && err2 == nil {
					done := true
					ends.Each(func(e kadm.ListedOffset) {
						if o, ok := offs.Lookup(topic, e.Partition); e.Offset > 0 && (!ok || o.At < e.Offset) {
							done = false
						}
					})
					if done {
						return true
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}

	// Committed offsets never go backwards.
	var backwards []string
	monDone := make(chan struct{})
	go func() {
		defer close(monDone)
		last := map[int32]int64{}
		for ctx.Err() == nil {
			os, err := adm.FetchOffsets(ctx, group)
			if err == nil {
				os.Each(func(o kadm.OffsetResponse) {
					if o.At < last[o.Partition] {
						mu.Lock()
						backwards = append(backwards, "partition "+strconv.Itoa(int(o.Partition))+": "+strconv.FormatInt(last[o.Partition], 10)+" -> "+strconv.FormatInt(o.At, 10))
						mu.Unlock()
					}
					last[o.Partition] = max(last[o.Partition], o.At)
				})
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	consume := func(r *Reader) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, io.EOF) {
						t.Errorf("%s: fetch: %v", r.Name(), err)
					}
					return
				}
				mu.Lock()
				processed[string(m.Value)]++
				mu.Unlock()
				if err := r.CommitMessages(ctx, m); err != nil && ctx.Err() == nil {
					t.Errorf("%s: commit: %v", r.Name(), err)
				}
			}
		}()
		return done
	}

	var duringCheckpoint map[string][]int32
	var takeover time.Duration
	hook(regA, func(hctx context.Context) error {
		// Runs after A's hook: A has left the group; B must take over at
		// once, not after A's session timeout.
		start := time.Now()
		for hctx.Err() == nil {
			if m := members(hctx, adm, group); len(m) == 1 && len(m["b"]) == parts {
				duringCheckpoint, takeover = m, time.Since(start)
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}, func(hctx context.Context, ev notify.Event) error {
		// Runs before A's hook: let B finish what it holds before A
		// rejoins and takes partitions from it.
		if !quiet(hctx) {
			t.Error("B did not catch up while A was checkpointed")
		}
		return nil
	})
	a := NewReader(groupConfig(k.addrs, group, topic, "a"), WithRegistry(regA), WithName("A"), WithLogger(log))
	defer a.Close()
	b := NewReader(groupConfig(k.addrs, group, topic, "b"), WithRegistry(regB), WithName("B"), WithLogger(log))
	defer b.Close()
	aDone, bDone := consume(a), consume(b)

	waitFor(t, 15*time.Second, "both readers in the group", func() bool {
		m := members(ctx, adm, group)
		return len(m) == 2 && len(m["a"]) > 0 && len(m["b"]) > 0
	})
	producing.Store(true)
	time.Sleep(300 * time.Millisecond)

	res := hooktest.SimulateOK(t, context.Background(), regA, notify.SimRestore, 5*time.Second)
	if duringCheckpoint == nil {
		t.Fatal("B did not get every partition while A was checkpointed")
	}
	t.Logf("B owned all partitions %v after A's before-checkpoint hook", takeover)
	rep := decodeReport[ReaderReport](t, res.Before[0].Details)
	if rep.GroupCheckpoint == nil || !rep.LeftGroup || rep.ConnectionsClosed != 0 {
		t.Errorf("A's before report = %v", res.Before[0].Details)
	}
	t.Logf("A before: %v", rep)
	newID := "a-" + res.Event.InstanceID[:8]
	if a.ClientID() != newID {
		t.Fatalf("A's client id = %q, want %q", a.ClientID(), newID)
	}
	waitFor(t, 15*time.Second, "A rejoining with its new identity", func() bool {
		m := members(ctx, adm, group)
		return len(m) == 2 && len(m[newID]) > 0 && len(m["b"]) > 0
	})
	time.Sleep(100 * time.Millisecond)
	producing.Store(true)
	time.Sleep(300 * time.Millisecond)

	// Stop producing, then wait until every record was processed.
	prod.Close()
	select {
	case <-prodDone:
	case <-time.After(10 * time.Second):
		t.Fatal("producer did not stop")
	}
	total := produced.Load()
	waitFor(t, 15*time.Second, "every record processed", allProcessed)
	cancel()
	<-aDone
	<-bDone
	<-monDone
	if len(backwards) > 0 {
		t.Fatalf("committed offsets went backwards: %v", backwards)
	}
	dups := 0
	for _, n := range processed {
		dups += n - 1
	}
	t.Logf("%d records produced, processed at least once, %d redeliveries", total, dups)
}

// TestReaderPartition checks that a reader without a group continues at the
// exact offset of the next record it would have handed out, although it had
// prefetched more, across a restore and a resume, and that a FetchMessage
// waiting for data during the checkpoint returns the next record after it.
func TestReaderPartition(t *testing.T) {
	const topic = "p"
	k := newFake(t, 1, topic)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	w := NewWriter(&kafka.Writer{Addr: kafka.TCP(k.addrs...), Topic: topic, BatchSize: 100, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll},
		WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer w.Close()
	write := func(from, to int) {
		var msgs []kafka.Message
		for i := from; i < to; i++ {
			msgs = append(msgs, kafka.Message{Value: []byte(strconv.Itoa(i))})
		}
		if err := w.WriteMessages(context.Background(), msgs...); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 100)

	r := NewReader(kafka.ReaderConfig{
		Brokers: k.addrs, Topic: topic, Partition: 0,
		MaxWait: 100 * time.Millisecond, ReadBackoffMin: 10 * time.Millisecond, ReadBackoffMax: 50 * time.Millisecond,
	}, WithRegistry(reg), WithLogger(log))
	defer r.Close()

	next := int64(0)
	read := func(n int) {
		t.Helper()
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			m, err := r.FetchMessage(ctx)
			cancel()
			if err != nil {
				t.Fatalf("fetch at %d: %v", next, err)
			}
			if m.Offset != next || string(m.Value) != strconv.FormatInt(next, 10) {
				t.Fatalf("got offset %d value %s, want %d", m.Offset, m.Value, next)
			}
			next++
		}
	}
	read(40)
	waitFor(t, 5*time.Second, "prefetched records", func() bool { return r.Stats().QueueLength > 0 })

	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	rep := decodeReport[ReaderReport](t, res.Before[0].Details)
	if rep.ReaderCheckpoint == nil || rep.NextOffset == nil || *rep.NextOffset != 40 || rep.PrefetchedDropped == 0 {
		t.Fatalf("before report = %v, want next_offset 40 and dropped prefetched records", res.Before[0].Details)
	}
	if r.Offset() != 40 {
		t.Fatalf("Offset() = %d after restore, want 40", r.Offset())
	}
	read(30)

	if res, err := reg.Simulate(context.Background(), notify.SimResume, 5*time.Second); err != nil || res.BeforeErr != nil {
		t.Fatalf("simulate resume: %v %v", err, res.BeforeErr)
	}
	read(30) // up to 100: the end of the partition

	// A fetch waiting for data when the checkpoint begins waits across it.
	got := make(chan kafka.Message, 1)
	go func() {
		m, err := r.FetchMessage(context.Background())
		if err != nil {
			t.Errorf("fetch across checkpoint: %v", err)
		}
		got <- m
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	write(100, 101)
	select {
	case m := <-got:
		if m.Offset != 100 {
			t.Fatalf("fetch across checkpoint returned offset %d, want 100", m.Offset)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("fetch across checkpoint did not return")
	}
}

// TestReaderGate: FetchMessage calls during a checkpoint block and then
// return the next record; one with its own deadline fails with it.
func TestReaderGate(t *testing.T) {
	const topic = "q"
	k := newFake(t, 1, topic)
	reg := notify.NewRegistry()
	log, _ := newLog(t)

	release := make(chan struct{})
	var inside sync.WaitGroup
	inside.Add(1)
	hook(reg, func(context.Context) error {
		inside.Done()
		<-release // keep the checkpoint under way
		return nil
	}, nil)
	r := NewReader(kafka.ReaderConfig{Brokers: k.addrs, Topic: topic, MaxWait: 100 * time.Millisecond}, WithRegistry(reg), WithLogger(log))
	defer r.Close()
	w := NewWriter(&kafka.Writer{Addr: kafka.TCP(k.addrs...), Topic: topic, BatchSize: 1}, WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer w.Close()
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("0")}, kafka.Message{Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if m, err := r.FetchMessage(context.Background()); err != nil || m.Offset != 0 {
		t.Fatalf("first fetch: %v %v", m.Offset, err)
	}

	sim := make(chan error, 1)
	go func() {
		_, err := reg.Simulate(context.Background(), notify.SimRestore, 10*time.Second)
		sim <- err
	}()
	inside.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := r.FetchMessage(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fetch with deadline during checkpoint: %v, want DeadlineExceeded", err)
	}
	got := make(chan error, 1)
	go func() {
		m, err := r.FetchMessage(context.Background())
		if err == nil && m.Offset != 1 {
			err = errors.New("got offset " + strconv.FormatInt(m.Offset, 10) + ", want 1")
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("fetch returned during the checkpoint: %v", err)
	case <-time.After(150 * time.Millisecond):
	}
	close(release)
	if err := <-sim; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocked fetch did not return after restore")
	}
}

// TestHandedTable checks the commit filter: unchanged before any checkpoint
// (also for commits of records the reader never fetched, a way to seek);
// after one, commits of records fetched before it are dropped unless the new
// generation handed their partition out from at most their offset and did
// not commit beyond.
func TestHandedTable(t *testing.T) {
	msg := func(p int, off int64) kafka.Message { return kafka.Message{Topic: "t", Partition: p, Offset: off} }
	h := newHandedTable(nil)
	if got := h.current([]kafka.Message{msg(0, 5), msg(9, 100)}); len(got) != 2 {
		t.Fatalf("before any checkpoint: kept %v", got)
	}
	for off := int64(10); off <= 20; off++ {
		h.note("t", 0, off)
	}
	h.note("t", 1, 7)
	h = h.next() // checkpoint: partition 0 was handed out up to 20, 1 up to 7
	for _, c := range []struct {
		m    kafka.Message
		keep bool
	}{
		{msg(0, 15), false}, // fetched before; partition not handed out again yet
		{msg(0, 21), true},  // never handed out before the checkpoint
		{msg(2, 3), true},   // partition unknown before the checkpoint
	} {
		if got := len(h.current([]kafka.Message{c.m})) == 1; got != c.keep {
			t.Errorf("%+v: kept %v, want %v", c.m, got, c.keep)
		}
	}
	h.note("t", 0, 12) // redelivered from the committed offset 12
	if got := h.current([]kafka.Message{msg(0, 11), msg(0, 15)}); len(got) != 1 || got[0].Offset != 15 {
		t.Fatalf("after redelivery from 12: kept %v, want only offset 15", got)
	}
	h.committed([]kafka.Message{msg(0, 18)})
	if got := h.current([]kafka.Message{msg(0, 15)}); len(got) != 0 {
		t.Fatalf("commit behind this generation's commit kept: %v", got)
	}
	if got := h.current([]kafka.Message{msg(0, 19)}); len(got) != 1 {
		t.Fatalf("commit ahead of this generation's commit dropped")
	}
	h = h.next()
	if got := h.current([]kafka.Message{msg(1, 7), msg(0, 20)}); len(got) != 0 {
		t.Fatalf("two checkpoints later, records fetched before both kept: %v", got)
	}
}

// TestReaderCommitIntervalFlushed: commits batched by CommitInterval are
// flushed by the before-checkpoint hook, which also leaves the group (the
// group is empty while the checkpoint is under way); after the restore the
// reader continues after the last committed record.
func TestReaderCommitIntervalFlushed(t *testing.T) {
	const topic, group = "ci", "cig"
	k, adm, reg, log, _ := groupRig(t, 1, topic, 30)

	var committedAtDump int64 = -1
	var stateAtDump string
	hook(reg, func(ctx context.Context) error {
		if os, err := adm.FetchOffsets(ctx, group); err == nil {
			if o, ok := os.Lookup(topic, 0); ok {
				committedAtDump = o.At
			}
		}
		if gs, err := adm.DescribeGroups(ctx, group); err == nil {
			stateAtDump = gs[group].State
		}
		return nil
	}, nil)
	c := groupConfig(k.addrs, group, topic, "ci")
	c.CommitInterval = time.Hour // only Close flushes
	r := NewReader(c, WithRegistry(reg), WithLogger(log))
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	fetchCommitInOrder(t, ctx, r, 20)
	if os, err := adm.FetchOffsets(ctx, group); err == nil {
		if o, ok := os.Lookup(topic, 0); ok && o.At > 0 {
			t.Fatalf("offset %d committed before the checkpoint; CommitInterval should hold it", o.At)
		}
	}
	hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	if committedAtDump != 20 {
		t.Fatalf("committed offset during the checkpoint = %d, want 20 (flushed by Close)", committedAtDump)
	}
	if stateAtDump != "Empty" {
		t.Fatalf("group state during the checkpoint = %q, want Empty (left)", stateAtDump)
	}
	m, err := r.FetchMessage(ctx)
	if err != nil || m.Offset != 20 {
		t.Fatalf("first fetch after restore: offset %d, %v; want 20", m.Offset, err)
	}
}
