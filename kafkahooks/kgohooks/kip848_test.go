package kgohooks

import (
	"context"
	"fmt"
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

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// new848 starts a kfake cluster whose KIP-848 groups heartbeat every 50 ms.
func new848(t *testing.T, partitions int32, topics ...string) []string {
	t.Helper()
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(partitions, topics...), kafkatest.FastGroups(),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "50"}))
	return addrs
}

// members848 returns the KIP-848 members of group as the broker describes
// them (ConsumerGroupDescribe).
func members848(t *testing.T, ctx context.Context, addrs []string, group string) []kadm.ConsumerGroupMember {
	t.Helper()
	gs, err := kadm.NewClient(mustClient(t, addrs)).DescribeConsumerGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe consumer group %s: %v", group, err)
	}
	g := gs[group]
	if g.Err != nil {
		t.Fatalf("describe consumer group %s: %v", group, g.Err)
	}
	return g.Members
}

// waitMembers848 waits until ok accepts the group's members.
func waitMembers848(t *testing.T, ctx context.Context, addrs []string, group, what string, ok func([]kadm.ConsumerGroupMember) bool) []kadm.ConsumerGroupMember {
	t.Helper()
	var ms []kadm.ConsumerGroupMember
	if !wait.Until(10*time.Second, func() bool { ms = members848(t, ctx, addrs, group); return ok(ms) }) {
		t.Fatalf("%s: members %s", what, fmtMembers(ms))
	}
	return ms
}

func fmtMembers(ms []kadm.ConsumerGroupMember) string {
	var out []string
	for _, m := range ms {
		inst := ""
		if m.InstanceID != nil {
			inst = " instance " + *m.InstanceID
		}
		out = append(out, fmt.Sprintf("{%s client %s%s epoch %d owns %v}", m.MemberID, m.ClientID, inst, m.MemberEpoch, m.Assignment))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// owned counts the partitions assigned to m (kfake describes them by topic
// id, which kadm leaves unnamed).
func owned(m kadm.ConsumerGroupMember) int {
	n := 0
	for _, ps := range m.Assignment {
		n += len(ps)
	}
	return n
}

// A KIP-848 group consumer (kgo.ServerSideBalancer) is checkpointed and
// restored: the checkpoint commits what was handed out and leaves the group
// (ConsumerGroupHeartbeat, epoch -1), the restored client joins under a new
// member id (KIP-1082: kgo draws it) and a new client id, owns both
// partitions, and every record is delivered exactly once.
func TestKIP848RestoreNewMember(t *testing.T) {
	addrs := new848(t, 2, "n")
	reg := notify.NewRegistry()
	ctx := testCtx(t, 20*time.Second)
	// Registered first: its before hook runs last, at the dump instant.
	var during []kadm.ConsumerGroupMember
	reg.Register("probe", notify.Func(func(context.Context) error {
		during = members848(t, ctx, addrs, "ng")
		return nil
	}, nil))
	producePlain(t, addrs, "n", vals("a", 30), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	c := newHooked(t, reg, groupOpts(addrs, "ng", "n", kgo.ServerSideBalancer(), kgo.ClientID("nc")))

	seen := map[string]int{}
	poll := func(max int) int {
		fs := c.PollRecords(ctx, max)
		for _, e := range fs.Errors() {
			t.Fatalf("poll: %v", e.Err)
		}
		n := 0
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++; n++ })
		return n
	}
	for got := 0; got < 12; {
		got += poll(12 - got)
	}
	before := waitMembers848(t, ctx, addrs, "ng", "one member", func(ms []kadm.ConsumerGroupMember) bool { return len(ms) == 1 })
	t.Logf("before: %s", fmtMembers(before))

	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	rep := res.Before[0]
	t.Logf("before report: %+v", rep)
	if rep.Details["left_group"] != true {
		t.Errorf("report %v: want left_group true", rep.Details)
	}
	if len(during) != 0 {
		t.Errorf("at the dump the group still has members %s: want none (the checkpoint leaves)", fmtMembers(during))
	}
	after := waitMembers848(t, ctx, addrs, "ng", "the restored member owning both partitions", func(ms []kadm.ConsumerGroupMember) bool {
		return len(ms) == 1 && owned(ms[0]) == 2
	})
	t.Logf("after: %s", fmtMembers(after))
	if after[0].MemberID == before[0].MemberID {
		t.Errorf("the restored member has the image's member id %s", after[0].MemberID)
	}
	if after[0].ClientID != c.ClientID() || after[0].ClientID == before[0].ClientID || !strings.HasPrefix(after[0].ClientID, "nc-") {
		t.Errorf("the restored member's client id %s (the client says %s, before %s): want nc-<instance>", after[0].ClientID, c.ClientID(), before[0].ClientID)
	}

	producePlain(t, addrs, "n", vals("b", 20), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	for total := 12; total < 50 && ctx.Err() == nil; {
		total += poll(-1)
	}
	var bad []string
	for _, v := range append(vals("a", 30), vals("b", 20)...) {
		if seen[v] != 1 {
			bad = append(bad, fmt.Sprintf("%s×%d", v, seen[v]))
		}
	}
	if len(bad) > 0 || len(seen) != 50 {
		t.Errorf("%d distinct records; delivered other than once: %v", len(seen), bad)
	}
}

// failCommits makes the next OffsetCommit requests of the cluster fail with
// codes, one code per request, every partition, and counts them.
func failCommits(c *kfake.Cluster, n *atomic.Int32, codes ...int16) {
	var mu sync.Mutex
	c.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(codes) == 0 {
			return nil, nil, false
		}
		c.KeepControl()
		code := codes[0]
		codes = codes[1:]
		n.Add(1)
		return kafkatest.FailCommit(kr, code), nil, true
	})
}

// The checkpoint's commit of a KIP-848 member gets STALE_MEMBER_EPOCH, then
// UNKNOWN_MEMBER_ID (what a broker before 4.3 may answer during a
// rebalance, and after a session expired), then goes through: the hook
// retries, the broker has exactly what was handed out committed, and after
// the restore every record is delivered once, none skipped.
func TestKIP848CheckpointCommitSurvivesMemberErrors(t *testing.T) {
	kc, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "e"),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "50"}))
	reg := notify.NewRegistry()
	ctx := testCtx(t, 30*time.Second)
	producePlain(t, addrs, "e", vals("a", 30), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	c := newHooked(t, reg, groupOpts(addrs, "eg", "e", kgo.ServerSideBalancer(), kgo.AutoCommitInterval(time.Hour)), WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	seen := map[string]int{}
	next := map[int32]int64{}
	poll := func(max int) int {
		fs := c.PollRecords(ctx, max)
		for _, e := range fs.Errors() {
			t.Fatalf("poll: %v", e.Err)
		}
		n := 0
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++; next[r.Partition] = r.Offset + 1; n++ })
		return n
	}
	for got := 0; got < 12; {
		got += poll(12 - got)
	}
	var failed atomic.Int32
	failCommits(kc, &failed, kerr.StaleMemberEpoch.Code, kerr.UnknownMemberID.Code)
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 10*time.Second)
	rep := res.Before[0].Details
	t.Logf("before report: %v", rep)
	if failed.Load() != 2 {
		t.Fatalf("%d commits failed by the test, want 2", failed.Load())
	}
	if a, _ := rep["commit_attempts"].(int); a < 3 {
		t.Errorf("report %v: want at least 3 commit attempts", rep)
	}
	offs := fetchCommitted(t, ctx, addrs, "eg")
	for p, want := range next {
		if o, _ := offs.Lookup("e", p); o.At != want {
			t.Errorf("partition %d: committed %d, want %d (what was handed out)", p, o.At, want)
		}
	}
	producePlain(t, addrs, "e", vals("b", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	for total := 12; total < 40 && ctx.Err() == nil; {
		total += poll(-1)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	c.PollFetches(short).EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++ })
	cancel()
	var bad []string
	for _, v := range append(vals("a", 30), vals("b", 10)...) {
		if seen[v] != 1 {
			bad = append(bad, fmt.Sprintf("%s×%d", v, seen[v]))
		}
	}
	if len(bad) > 0 || len(seen) != 40 {
		t.Errorf("%d distinct records; delivered other than once: %v", len(seen), bad)
	}
}

// A KIP-848 member checkpointed with --leave-running stays in its group: no
// leave is sent, and after the resume the same member (member id) owns
// both partitions and consumes what was produced meanwhile.
func TestKIP848LeaveRunningKeepsMember(t *testing.T) {
	addrs := new848(t, 2, "l")
	reg := notify.NewRegistry()
	ctx := testCtx(t, 20*time.Second)
	rr := kgo.RecordPartitioner(kgo.RoundRobinPartitioner())
	producePlain(t, addrs, "l", vals("a", 10), rr)
	c := newHooked(t, reg, groupOpts(addrs, "lg", "l", kgo.ServerSideBalancer()))
	got := kafkatest.PollValues(ctx, c, nil, 10)
	before := waitMembers848(t, ctx, addrs, "lg", "one member owning both partitions", func(ms []kadm.ConsumerGroupMember) bool {
		return len(ms) == 1 && owned(ms[0]) == 2
	})
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimLeaveRunning, 5*time.Second)
	if rep := res.Before[0].Details; rep["left_group"] != false || rep["kept_for_resume"] != true {
		t.Errorf("report %v: want left_group false, kept_for_resume true", rep)
	}
	producePlain(t, addrs, "l", vals("b", 10), rr)
	got = kafkatest.PollValues(ctx, c, got, 20)
	if want := append(vals("a", 10), vals("b", 10)...); len(got) != 20 || !sameSet(got, want) {
		t.Errorf("consumed %v, want %v once each", got, want)
	}
	after := members848(t, ctx, addrs, "lg")
	if len(after) != 1 || after[0].MemberID != before[0].MemberID {
		t.Errorf("members before %s, after the resume %s: want the same one", fmtMembers(before), fmtMembers(after))
	}
}

func sameSet(a, b []string) bool {
	m := map[string]int{}
	for _, v := range a {
		m[v]++
	}
	for _, v := range b {
		if m[v] != 1 {
			return false
		}
		delete(m, v)
	}
	return len(m) == 0
}

// The report says when a checkpoint leaves a classic group empty, so that
// its restore pays the broker's initial rebalance delay: a sole classic
// member, not one of two, and never a KIP-848 member.
func TestInitialDelayReported(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kip848  bool
		members int
		want    any
	}{{"classic-alone", false, 1, true}, {"classic-two", false, 2, nil}, {"kip848-alone", true, 1, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := new848(t, 2, "d")
			producePlain(t, addrs, "d", vals("a", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			// Generous: under CI's load two members took most of 20 s to
			// settle, and the checkpoint then ran out of time.
			ctx := testCtx(t, 60*time.Second)
			opts := groupOpts(addrs, "dg", "d")
			if tc.kip848 {
				opts = append(opts, kgo.ServerSideBalancer())
			}
			reg := notify.NewRegistry()
			c := newHooked(t, reg, opts)
			if tc.members == 2 {
				other := newHooked(t, notify.NewRegistry(), opts)
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				go func() {
					for cctx.Err() == nil {
						other.PollFetches(cctx)
					}
				}()
				adm := kadm.NewClient(mustClient(t, addrs))
				for {
					gs, err := adm.DescribeGroups(ctx, "dg")
					if err == nil && len(gs["dg"].Members) == 2 && gs["dg"].State == "Stable" {
						break
					}
					if ctx.Err() != nil {
						t.Fatalf("two members never formed: %v %v", gs, err)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			// Produce while c polls: with two members, the other may have
			// consumed (and committed) every record of c's partitions before
			// the group settled on them, and c would never get one.
			for got := 0; got == 0; {
				if ctx.Err() != nil {
					t.Fatal("c never got a record")
				}
				producePlain(t, addrs, "d", vals("b", 2), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
				short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				got = len(kafkatest.PollValues(short, c, nil, 1))
				cancel()
			}
			res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
			rep := res.Before[0].Details
			if rep["initial_rebalance_delay"] != tc.want {
				t.Errorf("report %v: want initial_rebalance_delay %v", rep, tc.want)
			}
		})
	}
}
