package kgohooks

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// A transactional producer without a group is resumed on the same kgo
// client: same producer id, same transactional id, and its next
// transactions commit; no connection is open at the dump instant.
func TestTxnClientResumeKeepsProducer(t *testing.T) {
	addrs, reg := newRig(t, 1, "t")
	cc := &connCounter{}
	atDump := dumpProbe(reg, cc)
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx"), kgo.Dialer(cc.Dial)})
	ctx := testCtx(t, 15*time.Second)
	runTxn(t, ctx, c, "a", 5, true)
	pid0, _, _ := c.ProducerID(ctx)
	kcl0 := c.Underlying()
	hooktest.SimulateOK(t, ctx, reg, notify.SimResume, 5*time.Second)
	if n := atDump.Load(); n != 0 {
		t.Errorf("%d connections open at the dump instant, want 0", n)
	}
	runTxn(t, ctx, c, "b", 5, true)
	// The epoch is not compared: with transactions v2 (KIP-890) every
	// EndTxn bumps it.
	pid1, _, _ := c.ProducerID(ctx)
	if c.Underlying() != kcl0 || pid1 != pid0 {
		t.Errorf("after resume: same kgo client %v, producer id %d (was %d); want the same client and producer",
			c.Underlying() == kcl0, pid1, pid0)
	}
	if id := c.TransactionalID(); id != "tx" {
		t.Errorf("transactional id after resume = %q, want tx", id)
	}
	want := slices.Concat(vals("a", 5), vals("b", 5))
	wantCommitted(t, addrs, "t", want)
}

// A direct-partition consumer is resumed on the same kgo client and goes on
// exactly after the last record it handed out: no skip, no redelivery.
func TestDirectPartitionsResumeKeepsClient(t *testing.T) {
	addrs, reg := newRig(t, 1, "d")
	producePlain(t, addrs, "d", vals("before", 10))
	cc := &connCounter{}
	atDump := dumpProbe(reg, cc)
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.FetchMaxWait(100 * time.Millisecond), kgo.Dialer(cc.Dial),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"d": {0: kgo.NewOffset().At(0)}})})
	ctx := testCtx(t, 15*time.Second)
	got := pollUpTo(t, ctx, c, nil, 4)
	kcl0 := c.Underlying()
	hooktest.SimulateOK(t, ctx, reg, notify.SimResume, 5*time.Second)
	if n := atDump.Load(); n != 0 {
		t.Errorf("%d connections open at the dump instant, want 0", n)
	}
	if c.Underlying() != kcl0 {
		t.Error("a resume replaced the kgo client of a direct consumer")
	}
	producePlain(t, addrs, "d", vals("after", 10))
	got = pollUpTo(t, ctx, c, got, 20)
	got = kafkatest.PollMore(ctx, c, got)
	if want := slices.Concat(vals("before", 10), vals("after", 10)); !slices.Equal(got, want) {
		t.Errorf("delivered %d records, want %d in order:\n got %v\nwant %v", len(got), len(want), got, want)
	}
}

// kgo cannot rejoin a group it left, so a group consumer gets a new kgo
// client on a resume too, and no connection of the old one is left open.
func TestGroupClientResumeIsNewClient(t *testing.T) {
	addrs, reg := newRig(t, 1, "g")
	cc := &connCounter{}
	atDump := dumpProbe(reg, cc)
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("grp"), kgo.ConsumeTopics("g"), kgo.Dialer(cc.Dial),
		kgo.FetchMaxWait(100 * time.Millisecond)})
	ctx := testCtx(t, 15*time.Second)
	producePlain(t, addrs, "g", vals("a", 3))
	got := kafkatest.PollValues(ctx, c, nil, 3)
	kcl0 := c.Underlying()
	hooktest.SimulateOK(t, ctx, reg, notify.SimResume, 5*time.Second)
	if n := atDump.Load(); n != 0 {
		t.Errorf("%d connections open at the dump instant, want 0", n)
	}
	if c.Underlying() == kcl0 {
		t.Error("a resumed group consumer kept a kgo client that has left its group")
	}
	producePlain(t, addrs, "g", vals("b", 3))
	got = kafkatest.PollValues(ctx, c, got, 6)
	if want := slices.Concat(vals("a", 3), vals("b", 3)); !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// With --leave-running a group member stays in the group with the same kgo
// client: same member id, no rebalance, no record delivered twice. A copy
// restored from that image gets a new client and never sends the image's
// LeaveGroup: the original's member is still in the group.
func TestGroupClientLeaveRunningKeepsMember(t *testing.T) {
	addrs := newCluster(t, 1, fmt.Sprintf("g%d", notify.SimLeaveRunning), fmt.Sprintf("g%d", notify.SimLeaveRunningCopy))
	for _, outcome := range []notify.SimOutcome{notify.SimLeaveRunning, notify.SimLeaveRunningCopy} {
		group := fmt.Sprintf("grp-%d", outcome)
		topic := fmt.Sprintf("g%d", outcome)
		producePlain(t, addrs, topic, vals("a", 3))
		reg := notify.NewRegistry()
		cc := &connCounter{}
		atDump := dumpProbe(reg, cc)
		c, err := New(groupOpts(addrs, group, topic, kgo.Dialer(cc.Dial),
			// The copy's new member waits for the image's, which never
			// leaves (the original, not here, would keep heartbeating),
			// to time out before its join and Close complete.
			kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100*time.Millisecond)), WithRegistry(reg))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		var got []string
		poll := func(n int) {
			for len(got) < n && ctx.Err() == nil {
				c.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
			}
		}
		poll(3)
		kcl0 := c.Underlying()
		member0, _ := kcl0.GroupMetadata()
		res, err := reg.Simulate(ctx, outcome, 5*time.Second)
		if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
			t.Fatalf("%v: cycle: %v, before %v, after %v", outcome, err, res.BeforeErr, res.AfterErr)
		}
		if n := atDump.Load(); n != 0 {
			t.Errorf("%v: %d connections open at the dump instant, want 0", outcome, n)
		}
		adm := kadm.NewClient(mustClient(t, addrs))
		described, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		var members []string
		for _, m := range described[group].Members {
			members = append(members, m.MemberID)
		}
		if !slices.Contains(members, member0) {
			t.Errorf("%v: the group's members %v lack the member %s of before the checkpoint: it left or was removed", outcome, members, member0)
		}
		if outcome == notify.SimLeaveRunning {
			if m, _ := c.Underlying().GroupMetadata(); c.Underlying() != kcl0 || m != member0 {
				t.Errorf("after --leave-running: same kgo client %v, member %s (was %s); want the same member", c.Underlying() == kcl0, m, member0)
			}
			producePlain(t, addrs, topic, vals("b", 3))
			poll(6)
			if want := slices.Concat(vals("a", 3), vals("b", 3)); !slices.Equal(got, want) {
				t.Errorf("delivered %v, want %v", got, want)
			}
		} else if c.Underlying() == kcl0 {
			t.Error("a copy restored from a --leave-running image kept the image's kgo client")
		}
		c.Close()
		cancel()
	}
}

// Close outside a checkpoint lets kgo leave the group as usual: the member
// is gone at once, not after the session timeout (45 s by default).
func TestCloseLeavesGroup(t *testing.T) {
	addrs := newCluster(t, 1, "g")
	producePlain(t, addrs, "g", vals("a", 1))
	c, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("cl"), kgo.ConsumeTopics("g"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, WithRegistry(notify.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 15*time.Second)
	for n := 0; n == 0 && ctx.Err() == nil; {
		n = c.PollFetches(ctx).NumRecords()
	}
	c.Close()
	adm := kadm.NewClient(mustClient(t, addrs))
	n := -1
	if !wait.Until(2*time.Second, func() bool {
		d, err := adm.DescribeGroups(ctx, "cl")
		if err != nil {
			t.Fatal(err)
		}
		n = len(d["cl"].Members)
		return n == 0
	}) {
		t.Fatalf("%d members in the group 2 s after Close: the client did not leave", n)
	}
}
