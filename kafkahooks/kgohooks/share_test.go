package kgohooks

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// shareCluster starts kfake with one topic of the given partitions and a
// share group that starts at the earliest offset; records are produced
// with values v-0 … v-(n-1).
func shareCluster(t *testing.T, partitions int32, topic, group string, n int) []string {
	t.Helper()
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(partitions, topic), kafkatest.FastGroups(),
		kfake.BrokerConfigs(map[string]string{"group.share.record.lock.duration.ms": "60000"}))
	c.SetGroupConfigs(group, map[string]string{"share.auto.offset.reset": "earliest"})
	produceValues(t, addrs, topic, vals("v", n))
	return addrs
}

func produceValues(t *testing.T, addrs []string, topic string, values []string) {
	t.Helper()
	p, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, v := range values {
		if err := p.ProduceSync(context.Background(), &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

func shareOpts(addrs []string, topic, group string, more ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic), kgo.ShareGroup(group),
		kgo.FetchMaxWait(200 * time.Millisecond), kgo.ClientID("share")}, more...)
}

// shareApp is a share consumer's poll loop: each record's value is noted
// and accepted; a handler may be held inside a batch with pause.
type shareApp struct {
	mu      sync.Mutex
	seen    map[string][]int32 // value → delivery counts seen
	pause   chan struct{}      // non-nil: the handler waits on it after its first record of a batch
	inBatch chan struct{}      // gets a value when the handler holds a batch
	done    chan struct{}
	autoAck bool // leave the acknowledgement to the next poll (kgo's auto-accept)
}

func runShareApp(ctx context.Context, c *ShareConsumer, pause chan struct{}, autoAck bool) *shareApp {
	a := &shareApp{seen: map[string][]int32{}, pause: pause, inBatch: make(chan struct{}, 1), done: make(chan struct{}), autoAck: autoAck}
	go func() {
		defer close(a.done)
		for ctx.Err() == nil {
			fs := c.PollFetches(ctx)
			first := true
			fs.EachRecord(func(r *kgo.Record) {
				if first && a.pause != nil {
					first = false
					select {
					case a.inBatch <- struct{}{}:
					default:
					}
					<-a.pause
				}
				a.mu.Lock()
				a.seen[string(r.Value)] = append(a.seen[string(r.Value)], r.DeliveryCount())
				a.mu.Unlock()
				if !a.autoAck {
					r.Ack(kgo.AckAccept)
				}
			})
		}
	}()
	return a
}

func (a *shareApp) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen)
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

func TestShareConsumerNeedsShareGroup(t *testing.T) {
	_, err := NewShareConsumer([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t")}, WithRegistry(notify.NewRegistry()))
	if err == nil || !strings.Contains(err.Error(), "kgo.ShareGroup") {
		t.Fatalf("err = %v, want one naming kgo.ShareGroup", err)
	}
}

// The application holds a batch when the checkpoint begins and polls again
// within the wait, acknowledging nothing itself (kgo's auto-accept): its
// records are accepted and flushed, nothing is
// released, the member leaves with no connection left, and the restored
// consumer (a new member, a new client id) gets every other record once.
func TestShareCheckpointHandBack(t *testing.T) {
	const n = 40
	addrs := shareCluster(t, 2, "sq", "sg", n)
	reg := notify.NewRegistry()
	c, err := NewShareConsumer(shareOpts(addrs, "sq", "sg", kgo.ShareMaxRecords(5), kgo.ShareMaxRecordsStrict()), WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pause := make(chan struct{})
	a := runShareApp(ctx, c, pause, true)
	<-a.inBatch
	first := c.Underlying()
	go func() {
		waitFor(t, 10*time.Second, "the gate to close", func() bool { return c.st.Load().gate != nil })
		close(pause) // the handler finishes its batch and polls again
	}()
	res, err := reg.Simulate(ctx, notify.SimRestore, 10*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v, %v, %v", err, res.BeforeErr, res.AfterErr)
	}
	rep := res.Before[0].Details
	if rep["records_held"].(int64) == 0 || rep["records_released"].(int64) != 0 || rep["acks_flushed"] != true ||
		rep["left_group"] != true || rep["connections_open"] != 0 {
		t.Fatalf("before-checkpoint report = %v", rep)
	}
	if c.Underlying() == first || c.ClientID() != "share-"+res.Event.ShortID() {
		t.Fatalf("after restore: same client %v, client id %q", c.Underlying() == first, c.ClientID())
	}
	waitFor(t, 20*time.Second, "every record", func() bool { return a.count() == n })
	cancel()
	<-a.done
	for v, counts := range a.seen {
		if len(counts) != 1 || counts[0] != 1 {
			t.Errorf("%s delivered %v times (delivery counts %v), want once", v, len(counts), counts)
		}
	}
}

// The handler is stuck inside its batch past the wait: ReleaseHeld releases
// the records it holds, another member gets them at once with a delivery
// count of 2, and the stuck handler's later acknowledgements change
// nothing. Every record is processed; the only duplicates are the released
// ones.
func TestShareCheckpointReleasesHeld(t *testing.T) {
	const n = 20
	addrs := shareCluster(t, 1, "sr", "sg", n)
	reg := notify.NewRegistry()
	c, err := NewShareConsumer(shareOpts(addrs, "sr", "sg", kgo.ShareMaxRecords(5), kgo.ShareMaxRecordsStrict()),
		WithRegistry(reg), WithHeldWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pause := make(chan struct{})
	a := runShareApp(ctx, c, pause, false)
	<-a.inBatch
	res, err := reg.Simulate(ctx, notify.SimRestore, 10*time.Second)
	if err != nil || res.BeforeErr != nil {
		t.Fatalf("simulate: %v, %v", err, res.BeforeErr)
	}
	released := res.Before[0].Details["records_released"].(int64)
	if released == 0 {
		t.Fatalf("nothing released: %v", res.Before[0].Details)
	}
	// Another member gets the released records now, not after the lock.
	other, err := kgo.NewClient(shareOpts(addrs, "sr", "sg")...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	b := &shareApp{seen: map[string][]int32{}}
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	defer pcancel()
	for redelivered := 0; int64(redelivered) < released && pctx.Err() == nil; {
		other.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			b.seen[string(r.Value)] = append(b.seen[string(r.Value)], r.DeliveryCount())
			if r.DeliveryCount() > 1 {
				redelivered++
			}
			r.Ack(kgo.AckAccept)
		})
	}
	if err := other.FlushAcks(ctx); err != nil {
		t.Fatal(err)
	}
	close(pause) // the stuck handler finishes: its acks change nothing
	waitFor(t, 20*time.Second, "every record", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		total := map[string]bool{}
		for v := range a.seen {
			total[v] = true
		}
		for v := range b.seen {
			total[v] = true
		}
		return len(total) == n
	})
	cancel()
	<-a.done
	dups := 0
	for v, counts := range b.seen {
		if _, ok := a.seen[v]; ok {
			dups++
			if counts[0] < 2 {
				t.Errorf("%s processed by both with delivery count %v: not a released record", v, counts)
			}
		}
	}
	if int64(dups) > released {
		t.Errorf("%d records processed twice, more than the %d released", dups, released)
	}
}

// RefuseHeld refuses the checkpoint as a carry veto; the consumer goes on
// with the same client and its records.
func TestShareCheckpointRefuseHeld(t *testing.T) {
	const n = 10
	addrs := shareCluster(t, 1, "sf", "sg", n)
	reg := notify.NewRegistry()
	c, err := NewShareConsumer(shareOpts(addrs, "sf", "sg", kgo.ShareMaxRecords(5), kgo.ShareMaxRecordsStrict()),
		WithRegistry(reg), WithHeldWait(200*time.Millisecond), WithHeldPolicy(RefuseHeld))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pause := make(chan struct{})
	a := runShareApp(ctx, c, pause, false)
	<-a.inBatch
	first := c.Underlying()
	res, err := reg.Simulate(ctx, notify.SimRestore, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ce *notify.CarryError
	if !errors.As(res.BeforeErr, &ce) || !errors.Is(res.BeforeErr, ErrRecordsHeld) || ce.Records == 0 {
		t.Fatalf("BeforeErr = %v, want a carry veto with ErrRecordsHeld", res.BeforeErr)
	}
	if res.Event.Kind != notify.Resume || c.Underlying() != first {
		t.Fatalf("event %v, same client %v: want a resume of the same client", res.Event.Kind, c.Underlying() == first)
	}
	close(pause)
	waitFor(t, 20*time.Second, "every record", func() bool { return a.count() == n })
	cancel()
	<-a.done
	for v, counts := range a.seen {
		if len(counts) != 1 {
			t.Errorf("%s delivered %d times", v, len(counts))
		}
	}
}

// A poll waiting for records when the checkpoint begins waits at the gate
// and returns records of the new client after the restore; a resume (the
// dump failed) builds a new member too, keeping the client id.
func TestShareCheckpointWaitingPoll(t *testing.T) {
	addrs := shareCluster(t, 1, "sw", "sg", 0)
	reg := notify.NewRegistry()
	c, err := NewShareConsumer(shareOpts(addrs, "sw", "sg"), WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan kgo.Fetches, 1)
	go func() { got <- c.PollFetches(ctx) }()
	waitFor(t, 10*time.Second, "the poll inside kgo", func() bool { return c.polls.Load() == 1 })
	res, err := reg.Simulate(ctx, notify.SimResume, 10*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v, %v, %v", err, res.BeforeErr, res.AfterErr)
	}
	if c.ClientID() != "share" || res.After[0].Details["new_client"] != true {
		t.Fatalf("after resume: client id %q, report %v", c.ClientID(), res.After[0].Details)
	}
	produceValues(t, addrs, "sw", []string{"late"})
	fs := <-got
	if errs := fs.Errors(); len(errs) > 0 {
		t.Fatalf("poll errors: %v", errs)
	}
	if rs := fs.Records(); len(rs) != 1 || string(rs[0].Value) != "late" {
		t.Fatalf("poll returned %d records", len(rs))
	}
}

// A handler that watches Quiescing releases the rest of its batch and polls
// again at once: the checkpoint does not wait out its held wait, releases
// nothing itself, and the records the handler released come back to the
// restored consumer, a new member, with a delivery count of 2.
func TestShareQuiescingHandler(t *testing.T) {
	const n = 10
	addrs := shareCluster(t, 1, "sq2", "sg", n)
	reg := notify.NewRegistry()
	c, err := NewShareConsumer(shareOpts(addrs, "sq2", "sg", kgo.ShareMaxRecords(n), kgo.ShareMaxRecordsStrict()),
		WithRegistry(reg), WithHeldWait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inBatch := make(chan struct{})
	next := make(chan []*kgo.Record, 1)
	go func() {
		fs := c.PollFetches(ctx)
		q := c.Quiescing()
		fs.Records()[0].Ack(kgo.AckAccept)
		close(inBatch)
		<-q
		c.MarkAcks(kgo.AckRelease)           // the rest, unprocessed
		next <- c.PollFetches(ctx).Records() // hands back, waits at the gate, then polls the new member
	}()
	<-inBatch
	start := time.Now()
	res, err := reg.Simulate(ctx, notify.SimRestore, 30*time.Second)
	if err != nil || res.BeforeErr != nil {
		t.Fatalf("simulate: %v, %v", err, res.BeforeErr)
	}
	if d := time.Since(start); d > 10*time.Second || res.Before[0].Details["records_released"].(int64) != 0 {
		t.Fatalf("checkpoint took %v, report %v: want no wait for the held records and nothing released by the hook", d, res.Before[0].Details)
	}
	got := map[string]int32{}
	for _, r := range <-next {
		got[string(r.Value)] = r.DeliveryCount()
	}
	for len(got) < n-1 && ctx.Err() == nil {
		c.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[string(r.Value)] = r.DeliveryCount() })
	}
	if len(got) != n-1 {
		t.Errorf("%d records delivered again, want the %d released: %v", len(got), n-1, got)
	}
	for v, dc := range got {
		if v == "v-0" || dc != 2 {
			t.Errorf("%s delivered again with delivery count %d: want the released ones only, with 2", v, dc)
		}
	}
}

// Acknowledgements the broker does not confirm within the budget refuse the
// checkpoint (ErrAcksNotFlushed): the consumer goes on, the same client and
// member, and its acknowledgements reach the broker once it answers.
func TestShareCheckpointAcksNotFlushed(t *testing.T) {
	const n = 5
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "sa"), kafkatest.FastGroups())
	c.SetGroupConfigs("sg", map[string]string{"share.auto.offset.reset": "earliest"})
	produceValues(t, addrs, "sa", vals("v", n))
	reg := notify.NewRegistry()
	cons, err := NewShareConsumer(shareOpts(addrs, "sa", "sg"), WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for len(rs) < n && ctx.Err() == nil {
		rs = append(rs, cons.PollFetches(ctx).Records()...)
	}
	release := make(chan struct{})
	for _, key := range []int16{78, 79} { // ShareFetch, ShareAcknowledge: both carry acknowledgements
		c.ControlKey(key, func(kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			c.SleepControl(func() { <-release })
			return nil, nil, false
		})
	}
	for _, r := range rs { // only now: no request sent before could carry them
		r.Ack(kgo.AckAccept)
	}
	first := cons.Underlying()
	res, err := reg.Simulate(ctx, notify.SimRestore, time.Second)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.BeforeErr, ErrAcksNotFlushed) || res.Event.Kind != notify.Resume || cons.Underlying() != first {
		t.Fatalf("BeforeErr %v, event %v, same client %v: want ErrAcksNotFlushed and a resume of the same client", res.BeforeErr, res.Event.Kind, cons.Underlying() == first)
	}
	if err := cons.FlushAcks(ctx); err != nil {
		t.Fatalf("acks after the refused checkpoint: %v", err)
	}
}
