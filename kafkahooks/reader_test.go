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
		SessionTimeout:    2 * time.Second,
		RebalanceTimeout:  2 * time.Second,
		JoinGroupBackoff:  50 * time.Millisecond,
		MaxWait:           100 * time.Millisecond,
		ReadBackoffMin:    10 * time.Millisecond,
		ReadBackoffMax:    50 * time.Millisecond,
		QueueCapacity:     50,
		MaxAttempts:       10,
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
// receiving records. A is checkpointed: while its checkpoint is under way B
// must own every partition (A left the group); after the restore A rejoins
// with a new client id. Committed offsets must never go backwards and every
// record must be processed at least once.
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

	// Producer: a record every 2ms.
	prod := NewWriter(&kafka.Writer{Addr: kafka.TCP(k.addrs...), Topic: topic, BatchSize: 1, RequiredAcks: kafka.RequireAll},
		WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer prod.Close()
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		for i := 0; ctx.Err() == nil; i++ {
			if err := prod.WriteMessages(ctx, kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
				return
			}
			produced.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()

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
	hook(regA, func(hctx context.Context) error {
		// Runs after A's hook: A has left the group; B must take over.
		for hctx.Err() == nil {
			if m := members(hctx, adm, group); len(m) == 1 && len(m["b"]) == parts {
				duringCheckpoint = m
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}, nil)
	a := NewReader(groupConfig(k.addrs, group, topic, "a"), WithRegistry(regA), WithName("A"), WithLogger(log))
	defer a.Close()
	b := NewReader(groupConfig(k.addrs, group, topic, "b"), WithRegistry(regB), WithName("B"), WithLogger(log))
	defer b.Close()
	aDone, bDone := consume(a), consume(b)

	waitFor(t, 15*time.Second, "both readers in the group", func() bool {
		m := members(ctx, adm, group)
		return len(m) == 2 && len(m["a"]) > 0 && len(m["b"]) > 0
	})
	time.Sleep(200 * time.Millisecond)

	res, err := regA.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v %v %v", err, res.BeforeErr, res.AfterErr)
	}
	if duringCheckpoint == nil {
		t.Fatal("B did not get every partition while A was checkpointed")
	}
	rep := res.Before[0].Details
	if rep["left_group"] != true || rep["connections_closed"] != 0 {
		t.Errorf("A's before report = %v", rep)
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
	time.Sleep(200 * time.Millisecond)

	// Stop producing, then wait until every record was processed.
	prod.Close()
	select {
	case <-prodDone:
	case <-time.After(10 * time.Second):
		t.Fatal("producer did not stop")
	}
	total := produced.Load()
	waitFor(t, 15*time.Second, "every record processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range total {
			if processed[strconv.FormatInt(i, 10)] == 0 {
				return false
			}
		}
		return true
	})
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

	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v %v %v", err, res.BeforeErr, res.AfterErr)
	}
	rep := res.Before[0].Details
	if rep["next_offset"] != int64(40) || rep["prefetched_dropped"].(int64) == 0 {
		t.Fatalf("before report = %v, want next_offset 40 and dropped prefetched records", rep)
	}
	if r.Offset() != 40 {
		t.Fatalf("Offset() = %d after restore, want 40", r.Offset())
	}
	read(30)

	res, err = reg.Simulate(context.Background(), notify.SimResume, 5*time.Second)
	if err != nil || res.BeforeErr != nil {
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
