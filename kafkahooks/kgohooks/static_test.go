package kgohooks

import (
	"context"
	"fmt"
	"slices"
	"sync"
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

// member is a group member as the broker describes it, for either protocol.
type member struct {
	id, instance, client string
	parts                int
}

func (m member) String() string {
	return fmt.Sprintf("{%s instance %q client %s, %d partitions}", m.id, m.instance, m.client, m.parts)
}

// protocolCase is a group protocol the static-member tests run on.
type protocolCase struct {
	name  string
	kopts []kgo.Opt // the group options of the protocol
	cfg   map[string]string
}

// protocols: classic with a 6 s session, and KIP-848 with a 6 s session
// (set by the broker for KIP-848 groups).
var protocols = []protocolCase{
	{name: "classic", kopts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond)}},
	{name: "kip848", kopts: []kgo.Opt{kgo.ServerSideBalancer()},
		cfg: map[string]string{"group.consumer.heartbeat.interval.ms": "50", "group.consumer.session.timeout.ms": "6000"}},
}

func (pc protocolCase) cluster(t *testing.T, partitions int32, topics ...string) []string {
	t.Helper()
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(partitions, topics...), kafkatest.FastGroups(), kfake.BrokerConfigs(pc.cfg))
	// As Kafka 4.3 does (kfake does not check it): a static leave
	// (member epoch -2) must name the instance.
	c.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ConsumerGroupHeartbeatRequest)
		if req.MemberEpoch != -2 || req.InstanceID != nil {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.Version = req.Version
		resp.ErrorCode = kerr.InvalidRequest.Code
		resp.ErrorMessage = kmsg.StringPtr("InstanceId can't be null.")
		return resp, nil, true
	})
	return addrs
}

// members describes group with the protocol's describe call.
func (pc protocolCase) members(t *testing.T, ctx context.Context, addrs []string, group string) []member {
	t.Helper()
	adm := kadm.NewClient(mustClient(t, addrs))
	var out []member
	str := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	if pc.name == "kip848" {
		gs, err := adm.DescribeConsumerGroups(ctx, group)
		if err != nil {
			t.Fatalf("describe %s: %v", group, err)
		}
		for _, m := range gs[group].Members {
			out = append(out, member{m.MemberID, str(m.InstanceID), m.ClientID, owned(m)})
		}
		return out
	}
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe %s: %v", group, err)
	}
	for _, m := range gs[group].Members {
		n := 0
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range c.Topics {
				n += len(tp.Partitions)
			}
		}
		out = append(out, member{m.MemberID, str(m.InstanceID), m.ClientID, n})
	}
	return out
}

func (pc protocolCase) waitMembers(t *testing.T, ctx context.Context, addrs []string, group, what string, ok func([]member) bool) []member {
	t.Helper()
	var ms []member
	if !wait.Until(10*time.Second, func() bool { ms = pc.members(t, ctx, addrs, group); return ok(ms) }) {
		t.Fatalf("%s: members %v", what, ms)
	}
	return ms
}

// afterReport returns the details of name's after-restore report.
func afterReport(res notify.SimResult, name string) map[string]any {
	for _, r := range res.After {
		if r.Name == name {
			return r.Details
		}
	}
	return nil
}

func byInstance(ms []member, inst string) (member, bool) {
	for _, m := range ms {
		if m.instance == inst {
			return m, true
		}
	}
	return member{}, false
}

// consumer polls c in the background and counts the values by prefix.
type consumer struct {
	mu   sync.Mutex
	seen map[string]int
	errs []string
}

func consume(ctx context.Context, wg *sync.WaitGroup, c kafkatest.Poller) *consumer {
	k := &consumer{seen: map[string]int{}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			fs := c.PollFetches(ctx)
			k.mu.Lock()
			fs.EachError(func(_ string, _ int32, err error) {
				if ctx.Err() == nil {
					k.errs = append(k.errs, err.Error())
				}
			})
			fs.EachRecord(func(r *kgo.Record) { k.seen[string(r.Value)]++ })
			k.mu.Unlock()
		}
	}()
	return k
}

func (k *consumer) count(prefix string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return countPrefixed(k.seen, prefix)
}

func (k *consumer) errors() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.errs)
}

// waitCount waits up to d until the consumers saw n distinct values of
// prefix between them, and returns how many they saw.
func waitCount(d time.Duration, prefix string, n int, ks ...*consumer) int {
	got := 0
	wait.Until(d, func() bool {
		got = 0
		for _, k := range ks {
			got += k.count(prefix)
		}
		return got >= n
	})
	return got
}

// A static member (kgo.InstanceID) is checkpointed and restored, beside a
// dynamic member. kgo sends no LeaveGroup for a static member (classic) or
// leaves with epoch -2, which keeps its partitions reserved (KIP-848), so
// the other member got them only after the session timeout. The checkpoint
// removes the static member: the other member consumes its partitions
// during the checkpoint, the report says left_group only then, and the
// restored copy joins under instance id base-<short> and consumes again.
func TestStaticMemberCheckpoint(t *testing.T) {
	for _, pc := range protocols {
		t.Run(pc.name, func(t *testing.T) {
			addrs := pc.cluster(t, 2, "s")
			rr := kgo.RecordPartitioner(kgo.RoundRobinPartitioner())
			producePlain(t, addrs, "s", vals("a", 20), rr)
			ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			opts := func(id string, extra ...kgo.Opt) []kgo.Opt {
				return append(append(groupOpts(addrs, "sg", "s", kgo.ClientID(id)), pc.kopts...), extra...)
			}
			regA := notify.NewRegistry()
			// Registered first, so its before hook runs after A's: A has
			// left, and B must consume both partitions now.
			var kb *consumer
			during := -1
			regA.Register("probe", notify.Func(func(context.Context) error {
				producePlain(t, addrs, "s", vals("d", 10), rr)
				during = waitCount(3*time.Second, "d-", 10, kb)
				return nil
			}, nil))
			a := newHooked(t, regA, opts("a", kgo.InstanceID("sa")))
			b := newHooked(t, notify.NewRegistry(), opts("b"))
			ka := consume(ctx, &wg, a)
			kb = consume(ctx, &wg, b)
			pc.waitMembers(t, ctx, addrs, "sg", "a and b sharing both partitions", func(ms []member) bool {
				return len(ms) == 2 && ms[0].parts == 1 && ms[1].parts == 1
			})
			if n := waitCount(10*time.Second, "a-", 20, ka, kb); n != 20 {
				t.Fatalf("%d of 20 records consumed before the checkpoint", n)
			}

			res := hooktest.SimulateOK(t, ctx, regA, notify.SimRestore, 5*time.Second)
			rep := res.Before[0].Details
			t.Logf("a's before report: %v", rep)
			if during != 10 {
				t.Errorf("b consumed %d of 10 records produced during the checkpoint within 3 s: the static member kept its partition", during)
			}
			if rep["left_group"] != true || rep["instance_id"] != "sa" {
				t.Errorf("a's report %v: want left_group true, instance_id sa", rep)
			}
			want := "sa-" + res.Event.ShortID()
			if r := afterReport(res, "kgo/a"); r["instance_id"] != want {
				t.Errorf("a's after-restore report %v: want instance_id %s", r, want)
			}
			ms := pc.waitMembers(t, ctx, addrs, "sg", "the restored copy in the group as "+want, func(ms []member) bool {
				m, ok := byInstance(ms, want)
				return ok && m.parts > 0 && len(ms) == 2
			})
			t.Logf("after the restore: %v", ms)
			if _, ok := byInstance(ms, "sa"); ok {
				t.Errorf("the image's static member sa is still in the group: %v", ms)
			}
			producePlain(t, addrs, "s", vals("z", 20), rr)
			if n := waitCount(10*time.Second, "z-", 20, ka, kb); n != 20 {
				t.Errorf("%d of 20 records consumed after the restore", n)
			}
			if ka.count("z-") == 0 {
				t.Errorf("the restored member consumed nothing after the restore")
			}
			if errs := append(ka.errors(), kb.errors()...); len(errs) > 0 {
				t.Errorf("fetch errors: %v", errs)
			}
		})
	}
}

// A copy restored from a --leave-running image of a static member joins
// under its own instance id: the original, which the image's client stands
// for here (it is closed without reaching the broker, as in a copy), stays
// the member of instance sa with its member id, and the copy consumes.
// Before, the copy joined as sa: it took the original's membership
// (classic), or was refused with UNRELEASED_INSTANCE_ID (KIP-848).
func TestStaticMemberLeaveRunningCopy(t *testing.T) {
	for _, pc := range protocols {
		t.Run(pc.name, func(t *testing.T) {
			addrs := pc.cluster(t, 2, "c")
			producePlain(t, addrs, "c", vals("a", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			reg := notify.NewRegistry()
			a := newHooked(t, reg, append(groupOpts(addrs, "cg", "c", kgo.ClientID("a"), kgo.InstanceID("sa")), pc.kopts...))
			ka := consume(ctx, &wg, a)
			if n := waitCount(10*time.Second, "a-", 10, ka); n != 10 {
				t.Fatalf("%d of 10 records consumed before the checkpoint", n)
			}
			orig := pc.waitMembers(t, ctx, addrs, "cg", "sa in the group", func(ms []member) bool { return len(ms) == 1 })
			res := hooktest.SimulateOK(t, ctx, reg, notify.SimLeaveRunningCopy, 5*time.Second)
			if rep := res.Before[0].Details; rep["left_group"] != false {
				t.Errorf("report %v: want left_group false (--leave-running)", rep)
			}
			want := "sa-" + res.Event.ShortID()
			ms := pc.waitMembers(t, ctx, addrs, "cg", "the copy in the group as "+want, func(ms []member) bool {
				_, ok := byInstance(ms, want)
				return ok
			})
			t.Logf("before: %v; after the copy's restore: %v", orig, ms)
			if m, ok := byInstance(ms, "sa"); !ok || m.id != orig[0].id {
				t.Errorf("the original's membership (instance sa, member %s) is gone: %v", orig[0].id, ms)
			}
			producePlain(t, addrs, "c", vals("z", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
			// The original is gone here, so its partitions come to the
			// copy once its session times out (6 s).
			if n := waitCount(15*time.Second, "z-", 10, ka); n != 10 {
				t.Errorf("the copy consumed %d of 10 records after the restore", n)
			}
			if errs := ka.errors(); len(errs) > 0 {
				t.Errorf("fetch errors: %v", errs)
			}
		})
	}
}
