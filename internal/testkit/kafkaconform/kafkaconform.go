// Package kafkaconform is the conformance suite of kcr's Kafka client
// wrappers: the promises every wrapper keeps across a checkpoint (nothing
// lost, nothing twice, unacknowledged records counted, the group left
// before the dump, a fresh identity for each copy, ...), as one table run
// against kfake and, when KCR_KAFKA_BROKERS is set, a real broker.
//
// A wrapper joins it with an adapter in its own _test.go: a Wrapper that
// builds its hooked producer and group consumer (a share consumer, with
// Caps.ShareGroup, runs the promises about the consumer). A new wrapper
// gets these tests by joining, and a wrapper that breaks one promise fails
// it.
package kafkaconform

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// Wrapper is what a Kafka client wrapper's test gives the suite.
type Wrapper interface {
	// Producer returns a hooked producer of topic on addrs, registered in
	// reg, whose client id starts as clientID; closed when t ends.
	Producer(t testing.TB, addrs []string, reg *notify.Registry, topic, clientID string) Producer
	// Consumer returns a hooked member of the consumer group (the share
	// group, with Caps.ShareGroup) that reads topic from its start,
	// registered in reg, whose client id starts as clientID; closed when t
	// ends.
	Consumer(t testing.TB, addrs []string, reg *notify.Registry, group, topic, clientID string) Consumer
	// Caps is what the client under the wrapper can do, where clients
	// differ.
	Caps() Caps
}

// Caps are the differences between clients that the promises allow for.
type Caps struct {
	// KeepsMemberOnLeaveRunning: a checkpoint with --leave-running keeps
	// the consumer's group member (kafka-go cannot: its Reader leaves the
	// group when it closes its connections).
	KeepsMemberOnLeaveRunning bool
	// Idempotent: the producer never writes a record twice, even when a
	// produce request cut off by the checkpoint reached the broker
	// (kafka-go has no idempotent producer: its records are on the topic at
	// least once, and acknowledged to the application once).
	Idempotent bool
	// ShareGroup: the Consumer is a member of a share group (KIP-932), not
	// of a consumer group. The suite starts the group at the earliest
	// offset and lists its members as a share group's, and runs only the
	// promises about the consumer: the producer is another wrapper's, with
	// its own run of the suite.
	ShareGroup bool
}

// Producer is a wrapper's hooked producer, as an application uses it.
type Producer interface {
	// Send produces the values, in order, and returns once each is
	// acknowledged.
	Send(ctx context.Context, values ...string) error
	// SendAsync hands the values to the client and returns at once; done is
	// called once per value with its acknowledgement's error.
	SendAsync(ctx context.Context, done func(error), values ...string) error
	// ClientID is the client id the producer sends now.
	ClientID() string
}

// Consumer is a wrapper's hooked group member, as an application uses it:
// each record handed out is processed and committed (at least once), or,
// in a share group, acknowledged as accepted.
type Consumer interface {
	// Next hands out at least one and at most n values, in order per
	// partition, and marks each processed; it returns ctx's error if none
	// came before ctx ended.
	Next(ctx context.Context, n int) ([]string, error)
	// ClientID is the client id the consumer sends now.
	ClientID() string
}

// Promise is one row of the suite: a behaviour every wrapper keeps.
type Promise struct {
	Name string
	// FakeOnly: the promise needs a broker the test controls (kfake holds
	// Produce requests); a real broker cannot be made to.
	FakeOnly bool
	// Consumer: the promise is about the consumer (a share-group wrapper
	// runs only these).
	Consumer bool
	Run      func(t *testing.T, e *Env)
}

// Env is what a promise's test gets: the wrapper and a broker.
type Env struct {
	W     Wrapper
	Addrs []string
	Fake  *kfake.Cluster // nil on a real broker
	Adm   *kadm.Client
	cl    *kgo.Client // Adm's
	seq   int
}

// Promises is the suite's table.
var Promises = []Promise{
	{Name: "ProducerNothingLost", Run: producerNothingLost},
	{Name: "ProducerUnacknowledgedCounted", FakeOnly: true, Run: producerUnacknowledgedCounted},
	{Name: "ConsumerOnceAcrossRestore", Consumer: true, Run: consumerOnceAcrossRestore},
	{Name: "ConsumerLeavesGroupBeforeDump", Consumer: true, Run: consumerLeavesGroupBeforeDump},
	{Name: "FreshIdentityPerCopy", Consumer: true, Run: freshIdentityPerCopy},
	{Name: "LeaveRunning", Consumer: true, Run: leaveRunning},
}

// Run runs every promise of the suite against w (those about the
// consumer for a share-group wrapper): on kfake, and on the real broker of
// KCR_KAFKA_BROKERS when it is set (with KCR_E2E=1, as in CI, it must be).
func Run(t *testing.T, w Wrapper) {
	share := w.Caps().ShareGroup
	t.Run("kfake", func(t *testing.T) {
		for _, p := range Promises {
			if share && !p.Consumer {
				continue
			}
			t.Run(p.Name, func(t *testing.T) {
				c, addrs := kafkatest.Cluster(t, kafkatest.FastGroups())
				p.Run(t, newEnv(t, w, addrs, c))
			})
		}
	})
	brokers := os.Getenv("KCR_KAFKA_BROKERS")
	if brokers == "" {
		// CI (KCR_E2E=1) runs every wrapper against the real broker too:
		// a run that forgot the broker must not pass on kfake alone.
		if os.Getenv("KCR_E2E") == "1" {
			t.Fatal("KCR_E2E=1 without KCR_KAFKA_BROKERS: the conformance suite runs against a real broker too (scripts/kafka-up.sh starts one)")
		}
		return
	}
	t.Run("broker", func(t *testing.T) {
		for _, p := range Promises {
			if p.FakeOnly || share && !p.Consumer {
				continue
			}
			t.Run(p.Name, func(t *testing.T) {
				p.Run(t, newEnv(t, w, strings.Split(brokers, ","), nil))
			})
		}
	})
}

func newEnv(t *testing.T, w Wrapper, addrs []string, c *kfake.Cluster) *Env {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &Env{W: w, Addrs: addrs, Fake: c, Adm: kadm.NewClient(cl), cl: cl}
}

// Group names a group of its own for this test; a share group is set to
// start at the earliest offset of its topics (Kafka's default is the
// latest), as the promises read records produced before the member joins.
func (e *Env) Group(t *testing.T) string {
	t.Helper()
	group := e.Name(t, "g")
	if !e.W.Caps().ShareGroup {
		return group
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name = "share.auto.offset.reset"
	cfg.Value = kmsg.StringPtr("earliest")
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, e.cl)
	if err == nil && len(resp.Resources) == 1 && resp.Resources[0].ErrorCode != 0 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("share.auto.offset.reset of group %s: %v", group, err)
	}
	return group
}

// Topic creates a topic of its own with the given partitions; Name gives
// unique group and client names, so runs on a shared broker do not meet.
func (e *Env) Topic(t *testing.T, partitions int32) string {
	t.Helper()
	name := e.Name(t, "t")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.Adm.CreateTopic(ctx, partitions, -1, nil, name); err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	// Cleanups run last first: this one after the clients' Close.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.Adm.DeleteTopics(ctx, name); err != nil {
			t.Logf("deleting topic %s: %v", name, err)
		}
	})
	return name
}

// Name is a name unique to this test and run.
func (e *Env) Name(t *testing.T, kind string) string {
	e.seq++
	return fmt.Sprintf("kcrconf-%s-%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), kind, time.Now().UnixNano()%1e9, e.seq)
}

// produce writes values to topic with a plain client of the suite's own.
func (e *Env) produce(t *testing.T, topic string, values []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.Addrs...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// members is the group's members as the broker lists them: member id →
// client id.
func (e *Env) members(ctx context.Context, group string) (map[string]string, error) {
	_, m, err := e.describe(ctx, group)
	return m, err
}

// describe is the group's state and members (member id → client id), of a
// consumer group or, with Caps.ShareGroup, of a share group; a group the
// broker does not know has none.
func (e *Env) describe(ctx context.Context, group string) (state string, members map[string]string, err error) {
	members = map[string]string{}
	if e.W.Caps().ShareGroup {
		gs, err := e.Adm.DescribeShareGroups(ctx, group)
		g, ok := gs[group]
		switch {
		case err != nil:
			return "", nil, err
		case !ok:
			return "", nil, fmt.Errorf("share group %s not described", group)
		case g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound):
			return "", nil, g.Err
		}
		for _, m := range g.Members {
			members[m.MemberID] = m.ClientID
		}
		return g.GroupState, members, nil
	}
	gs, err := e.Adm.DescribeGroups(ctx, group)
	if err != nil {
		return "", nil, err
	}
	g, ok := gs[group]
	if !ok {
		return "", nil, fmt.Errorf("group %s not described", group)
	}
	if g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound) {
		return "", nil, g.Err
	}
	for _, m := range g.Members {
		members[m.MemberID] = m.ClientID
	}
	return g.State, members, nil
}

// stableMembers waits until the group is stable with n members, and
// returns them.
func (e *Env) stableMembers(t *testing.T, group string, n int) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var state string
	var last map[string]string
	for ctx.Err() == nil {
		var err error
		if state, last, err = e.describe(ctx, group); err == nil && state == "Stable" && len(last) == n {
			return last
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("group %s not stable with %d members within 30 s (%s, %v)", group, n, state, last)
	return nil
}

// simulate runs a cycle on reg and fails the test unless both phases
// succeeded.
func simulate(t *testing.T, ctx context.Context, reg *notify.Registry, outcome notify.SimOutcome) notify.SimResult {
	t.Helper()
	res, err := reg.Simulate(ctx, outcome, 10*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("cycle %v: %v, before %v, after %v", outcome, err, res.BeforeErr, res.AfterErr)
	}
	return res
}

func vals(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// consumeUntil calls Next until the values seen hold every one of want,
// then a little longer, so that a record handed out twice shows; it
// returns how often each value was handed out.
func consumeUntil(t *testing.T, ctx context.Context, c Consumer, seen map[string]int, want []string) {
	t.Helper()
	missing := func() int {
		n := 0
		for _, v := range want {
			if seen[v] == 0 {
				n++
			}
		}
		return n
	}
	for missing() > 0 {
		got, err := c.Next(ctx, missing())
		if err != nil {
			t.Fatalf("consuming: %v (still missing %d of %d)", err, missing(), len(want))
		}
		for _, v := range got {
			seen[v]++
		}
	}
	more, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	for more.Err() == nil {
		got, _ := c.Next(more, 100)
		for _, v := range got {
			seen[v]++
		}
	}
}

// producerNothingLost: every acknowledged record is on the topic exactly
// once and in order, across a restore and a resume.
func producerNothingLost(t *testing.T, e *Env) {
	topic := e.Topic(t, 1)
	reg := notify.NewRegistry()
	p := e.W.Producer(t, e.Addrs, reg, topic, e.Name(t, "p"))
	ctx := testCtx(t)
	if err := p.Send(ctx, vals("a", 5)...); err != nil {
		t.Fatal(err)
	}
	simulate(t, ctx, reg, notify.SimRestore)
	if err := p.Send(ctx, vals("b", 5)...); err != nil {
		t.Fatalf("after a restore: %v", err)
	}
	simulate(t, ctx, reg, notify.SimResume)
	if err := p.Send(ctx, vals("c", 5)...); err != nil {
		t.Fatalf("after a resume: %v", err)
	}
	want := slices.Concat(vals("a", 5), vals("b", 5), vals("c", 5))
	if got := kafkatest.ReadValues(t, e.Addrs, topic, len(want)); !slices.Equal(got, want) {
		t.Errorf("topic holds %v, want %v", got, want)
	}
}

// producerUnacknowledgedCounted: a checkpoint that asks for no carried
// records (notify.WithRequireDrained) while the broker has not acknowledged
// some is refused with a notify.CarryError that counts them, as the report
// does; the process resumes, and the records are acknowledged once the
// broker answers, on the topic (exactly once with an idempotent producer).
func producerUnacknowledgedCounted(t *testing.T, e *Env) {
	topic := e.Topic(t, 1)
	reg := notify.NewRegistry()
	p := e.W.Producer(t, e.Addrs, reg, topic, e.Name(t, "p"))
	ctx := testCtx(t)
	if err := p.Send(ctx, "x-0"); err != nil {
		t.Fatal(err)
	}
	var holding atomic.Bool
	held := make(chan struct{})
	var heldOnce sync.Once
	release := make(chan struct{})
	holding.Store(true)
	e.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.Fake.KeepControl()
		if holding.Load() {
			heldOnce.Do(func() { close(held) })
			e.Fake.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	acked := make(chan error, 3)
	if err := p.SendAsync(ctx, func(err error) { acked <- err }, vals("x", 4)[1:]...); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the broker held no produce request")
	}
	res, err := reg.Simulate(notify.WithRequireDrained(ctx), notify.SimRestore, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ce *notify.CarryError
	if !errors.As(res.BeforeErr, &ce) || ce.Records <= 0 {
		t.Errorf("before error %v: want a notify.CarryError counting the unacknowledged records", res.BeforeErr)
	} else if rep := res.Before[len(res.Before)-1]; !rep.CarryVeto || rep.Carried != ce.Records {
		t.Errorf("report carry_veto %v, carried %d; want a veto of %d records", rep.CarryVeto, rep.Carried, ce.Records)
	}
	if res.Event.Kind != notify.Resume || res.AfterErr != nil {
		t.Errorf("event %v, after error %v: want a clean resume", res.Event.Kind, res.AfterErr)
	}
	holding.Store(false)
	close(release)
	for range 3 {
		select {
		case err := <-acked:
			if err != nil {
				t.Errorf("a record held at the refused checkpoint failed: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("records held at the refused checkpoint were never acknowledged")
		}
	}
	got := kafkatest.ReadValues(t, e.Addrs, topic, 4)
	if e.W.Caps().Idempotent && !slices.Equal(got, vals("x", 4)) {
		t.Errorf("topic holds %v, want %v", got, vals("x", 4))
	}
	for _, v := range vals("x", 4) {
		if !slices.Contains(got, v) {
			t.Errorf("%s missing from the topic, which holds %v", v, got)
		}
	}
}

// consumerOnceAcrossRestore: a group member restored from an image goes on
// after the last record it handed out: no record skipped, none handed out
// twice.
func consumerOnceAcrossRestore(t *testing.T, e *Env) {
	topic := e.Topic(t, 2)
	group := e.Group(t)
	e.produce(t, topic, vals("a", 10))
	reg := notify.NewRegistry()
	c := e.W.Consumer(t, e.Addrs, reg, group, topic, e.Name(t, "c"))
	ctx := testCtx(t)
	seen := map[string]int{}
	for n := 0; n < 4; {
		got, err := c.Next(ctx, 4-n)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range got {
			seen[v]++
		}
		n += len(got)
	}
	simulate(t, ctx, reg, notify.SimRestore)
	e.produce(t, topic, vals("b", 10))
	consumeUntil(t, ctx, c, seen, slices.Concat(vals("a", 10), vals("b", 10)))
	for v, n := range seen {
		if n != 1 {
			t.Errorf("%s handed out %d times, want once", v, n)
		}
	}
}

// consumerLeavesGroupBeforeDump: at the dump instant the member has left
// its group, so that the image holds no member that a copy would share
// with the broker; after the restore the group has one member, the
// restored one, and it consumes.
func consumerLeavesGroupBeforeDump(t *testing.T, e *Env) {
	topic := e.Topic(t, 1)
	group := e.Group(t)
	e.produce(t, topic, vals("a", 2))
	reg := notify.NewRegistry()
	// Registered first, so its before hook runs last: the dump instant.
	var atDump map[string]string
	var atDumpErr error
	reg.Register("dump-instant", notify.Func(func(ctx context.Context) error {
		atDump, atDumpErr = e.members(ctx, group)
		return nil
	}, nil))
	c := e.W.Consumer(t, e.Addrs, reg, group, topic, e.Name(t, "c"))
	ctx := testCtx(t)
	seen := map[string]int{}
	consumeUntil(t, ctx, c, seen, vals("a", 2))
	e.stableMembers(t, group, 1)
	simulate(t, ctx, reg, notify.SimRestore)
	if atDumpErr != nil || len(atDump) != 0 {
		t.Errorf("at the dump instant the group has members %v (%v), want none", atDump, atDumpErr)
	}
	e.produce(t, topic, vals("b", 2))
	consumeUntil(t, ctx, c, seen, slices.Concat(vals("a", 2), vals("b", 2)))
	if m := e.stableMembers(t, group, 1); !slices.Contains(slices.Collect(maps.Values(m)), c.ClientID()) {
		t.Errorf("after the restore the group's member is %v, want the restored client %q", m, c.ClientID())
	}
}

// freshIdentityPerCopy: every restored copy sends a client id of its own,
// different from the image's and from the copy's before it, and its group
// member is known to the broker under it; a resume keeps the id.
func freshIdentityPerCopy(t *testing.T, e *Env) {
	topic := e.Topic(t, 1)
	group := e.Group(t)
	reg := notify.NewRegistry()
	p := e.W.Producer(t, e.Addrs, reg, topic, e.Name(t, "p"))
	c := e.W.Consumer(t, e.Addrs, reg, group, topic, e.Name(t, "c"))
	ctx := testCtx(t)
	seen := map[string]int{}
	if err := p.Send(ctx, "a-0"); err != nil {
		t.Fatal(err)
	}
	consumeUntil(t, ctx, c, seen, vals("a", 1))
	ids := map[string]string{"producer": p.ClientID(), "consumer": c.ClientID()}
	now := func() map[string]string { return map[string]string{"producer": p.ClientID(), "consumer": c.ClientID()} }
	for copyN := 1; copyN <= 2; copyN++ {
		simulate(t, ctx, reg, notify.SimRestore)
		for role, id := range now() {
			if id == ids[role] || id == "" {
				t.Errorf("copy %d: the %s's client id is %q, want one of its own (was %q)", copyN, role, id, ids[role])
			}
			ids[role] = id
		}
		v := fmt.Sprintf("copy%d", copyN)
		if err := p.Send(ctx, v+"-0"); err != nil {
			t.Fatal(err)
		}
		consumeUntil(t, ctx, c, seen, vals(v, 1))
		if m := e.stableMembers(t, group, 1); !slices.Contains(slices.Collect(maps.Values(m)), c.ClientID()) {
			t.Errorf("copy %d: the broker lists the group's member as %v, want the client id %q", copyN, m, c.ClientID())
		}
	}
	simulate(t, ctx, reg, notify.SimResume)
	for role, id := range now() {
		if id != ids[role] {
			t.Errorf("a resume changed the %s's client id from %q to %q", role, ids[role], id)
		}
	}
}

// leaveRunning: a checkpoint with --leave-running loses nothing and hands
// out nothing twice; a wrapper that keeps its member keeps the same member
// id and client id at the broker.
func leaveRunning(t *testing.T, e *Env) {
	topic := e.Topic(t, 1)
	group := e.Group(t)
	e.produce(t, topic, vals("a", 3))
	reg := notify.NewRegistry()
	c := e.W.Consumer(t, e.Addrs, reg, group, topic, e.Name(t, "c"))
	ctx := testCtx(t)
	seen := map[string]int{}
	consumeUntil(t, ctx, c, seen, vals("a", 3))
	before := e.stableMembers(t, group, 1)
	id := c.ClientID()
	simulate(t, ctx, reg, notify.SimLeaveRunning)
	if e.W.Caps().KeepsMemberOnLeaveRunning {
		members, err := e.members(ctx, group)
		if err != nil || !maps.Equal(members, before) {
			t.Errorf("after a --leave-running checkpoint the group's members are %v (%v), want the same member %v", members, err, before)
		}
	}
	if c.ClientID() != id {
		t.Errorf("--leave-running changed the client id from %q to %q", id, c.ClientID())
	}
	e.produce(t, topic, vals("b", 3))
	consumeUntil(t, ctx, c, seen, slices.Concat(vals("a", 3), vals("b", 3)))
	for v, n := range seen {
		if n != 1 {
			t.Errorf("%s handed out %d times, want once", v, n)
		}
	}
}
