package kgohooks

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// liveClients is a kgo hook (kgo.WithHooks) that counts the kgo clients
// alive at once, as a metrics hook like kprom's sees them: kprom registers
// its metrics in OnNewClient and panics if a second client registers before
// the first is closed.
type liveClients struct {
	mu        sync.Mutex
	live, max int
}

func (l *liveClients) OnNewClient(*kgo.Client) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live++
	l.max = max(l.max, l.live)
}

func (l *liveClients) OnClientClosed(*kgo.Client) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live--
}

func (l *liveClients) counts() (live, max int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live, l.max
}

// blockMember is a group member with kgo.BlockRebalanceOnPoll running kgo's
// documented loop: PollFetches, process, AllowRebalance.
type blockMember struct {
	c    *Client
	live *liveClients
	mu   sync.Mutex
	seen map[string]int
	// hold, when set, makes the loop keep the records of its next non-empty
	// poll without calling AllowRebalance until release is closed.
	hold    chan struct{}
	holding chan struct{} // closed when the loop holds records
}

func newBlockMember(t *testing.T, addrs []string, group, topic, name string, reg *notify.Registry) *blockMember {
	t.Helper()
	m := &blockMember{live: &liveClients{}, seen: map[string]int{}}
	c, err := New(groupOpts(addrs, group, topic, kgo.BlockRebalanceOnPoll(), kgo.SessionTimeout(2*time.Second),
		kgo.HeartbeatInterval(100*time.Millisecond), kgo.ClientID(name), kgo.WithHooks(m.live)),
		WithRegistry(reg), WithName(name))
	if err != nil {
		t.Fatal(err)
	}
	m.c = c
	return m
}

func (m *blockMember) run(ctx context.Context, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			fs := m.c.PollFetches(ctx)
			m.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) { m.seen[string(r.Value)]++ })
			hold := m.hold
			m.mu.Unlock()
			if hold != nil && fs.NumRecords() > 0 {
				m.mu.Lock()
				m.hold = nil
				m.mu.Unlock()
				close(m.holding)
				select {
				case <-hold:
				case <-ctx.Done():
				}
			}
			m.c.AllowRebalance()
		}
	}()
}

func (m *blockMember) count(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return countPrefixed(m.seen, prefix)
}

func countBoth(a, b *blockMember, prefix string) int { return a.count(prefix) + b.count(prefix) }

// runMember starts member "a" of group topic, with a registry of its own,
// in kgo's loop until the test ends. With release set, the member holds the
// records of its first non-empty poll until release is closed.
func runMember(t *testing.T, addrs []string, topic string, release chan struct{}) (*blockMember, *notify.Registry, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	reg := notify.NewRegistry()
	a := newBlockMember(t, addrs, topic, topic, "a", reg)
	if release != nil {
		a.hold, a.holding = release, make(chan struct{})
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		a.c.Close()
	})
	a.run(ctx, &wg)
	return a, reg, ctx
}

// A group member with kgo.BlockRebalanceOnPoll, in kgo's documented
// loop, is checkpointed: the checkpoint succeeds and the member leaves the
// group, the other member takes its partitions during the checkpoint, the
// restored member consumes again, and never are two kgo clients of one
// kgohooks.Client alive at once (kgo.WithHooks sees them).
func TestBlockRebalanceOnPollCheckpoint(t *testing.T) {
	addrs := newCluster(t, 2, "blk")
	producePlain(t, addrs, "blk", vals("a", 20), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	regA, regB := notify.NewRegistry(), notify.NewRegistry()
	var a, b *blockMember
	// Registered first on A: runs after A's before hook.
	duringOK := make(chan bool, 1)
	regA.Register("probe", notify.Func(func(context.Context) error {
		producePlain(t, addrs, "blk", vals("d", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
		wait.Until(3*time.Second, func() bool { return b.count("d-") >= 10 })
		duringOK <- b.count("d-") == 10
		return nil
	}, nil))
	a = newBlockMember(t, addrs, "blk", "blk", "a", regA)
	defer a.c.Close()
	b = newBlockMember(t, addrs, "blk", "blk", "b", regB)
	defer b.c.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	a.run(ctx, &wg)
	b.run(ctx, &wg)
	wait.For(t, 10*time.Second, "the first records consumed", func() bool { return countBoth(a, b, "a-") == 20 })

	res, err := regA.Simulate(ctx, notify.SimRestore, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("cycle: before %v, after %v", res.BeforeErr, res.AfterErr)
	}
	if rep, _ := a.c.Report(); rep.Checkpoint != nil {
		t.Fatalf("last report is the checkpoint's: %+v", rep)
	}
	for _, r := range res.Before {
		if r.Name == "a" && r.Details["left_group"] != true {
			t.Errorf("before report %v: want left_group true", r.Details)
		}
	}
	if !<-duringOK {
		t.Errorf("the other member consumed %d of the 10 records produced during the checkpoint", b.count("d-"))
	}
	producePlain(t, addrs, "blk", vals("z", 40), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	wait.For(t, 10*time.Second, "the records produced after the restore consumed", func() bool { return countBoth(a, b, "z-") == 40 })
	// The restored member rejoins and gets partitions again.
	wait.For(t, 10*time.Second, "the restored member consuming", func() bool {
		if a.count("y-") > 0 {
			return true
		}
		producePlain(t, addrs, "blk", vals("y", 2), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
		time.Sleep(100 * time.Millisecond)
		return false
	})
	if live, mx := a.live.counts(); live != 1 || mx != 1 {
		t.Errorf("kgo clients of the checkpointed member: %d alive, at most %d at once; want 1 and 1", live, mx)
	}
}

// BlockRebalanceOnPoll, refused. The application holds records it polled with
// BlockRebalanceOnPoll and does not call AllowRebalance within the budget:
// the checkpoint is refused with ErrRebalanceBlocked before anything is torn
// down, the member goes on with the same kgo client (no zombie member, no
// second client), and consumes again once it allows the rebalance.
func TestBlockRebalanceOnPollHeldRefuses(t *testing.T) {
	addrs := newCluster(t, 1, "blh")
	producePlain(t, addrs, "blh", vals("a", 5))
	release := make(chan struct{})
	a, reg, ctx := runMember(t, addrs, "blh", release)
	<-a.holding
	kcl0 := a.c.Underlying()
	member0, _ := kcl0.GroupMetadata()

	hooktest.SimulateRefused(t, ctx, reg, 2*time.Second, ErrRebalanceBlocked)
	if a.c.Underlying() != kcl0 {
		t.Errorf("the refused checkpoint replaced the kgo client: the old member may still be in the group")
	}
	close(release)
	producePlain(t, addrs, "blh", vals("b", 5))
	wait.For(t, 10*time.Second, "the member consuming after the refused checkpoint", func() bool { return a.count("b-") == 5 })
	d, err := kadm.NewClient(mustClient(t, addrs)).DescribeGroups(ctx, "blh")
	if err != nil {
		t.Fatal(err)
	}
	if ms := d["blh"].Members; len(ms) != 1 || ms[0].MemberID != member0 {
		t.Errorf("group members %v after the refused checkpoint: want only %s", ms, member0)
	}
	if live, mx := a.live.counts(); live != 1 || mx != 1 {
		t.Errorf("kgo clients: %d alive, at most %d at once; want 1 and 1", live, mx)
	}
}

// BlockRebalanceOnPoll, --leave-running copy. A copy restored from a --leave-running image of
// a BlockRebalanceOnPoll member closes the image's kgo client without
// waiting for an AllowRebalance that the image's poll never got, and
// consumes.
func TestBlockRebalanceOnPollLeaveRunningCopy(t *testing.T) {
	addrs := newCluster(t, 1, "blc")
	producePlain(t, addrs, "blc", vals("a", 5))
	a, reg, ctx := runMember(t, addrs, "blc", nil)
	wait.For(t, 10*time.Second, "the first records consumed", func() bool { return a.count("a-") == 5 })
	const budget = 4 * time.Second
	res, err := reg.Simulate(ctx, notify.SimLeaveRunningCopy, budget)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("cycle: %v, before %v, after %v", err, res.BeforeErr, res.AfterErr)
	}
	rep, _ := a.c.Report()
	if rep.Restore == nil || !rep.NewClient || time.Duration(rep.DurationMS)*time.Millisecond > budget/2 {
		t.Errorf("after-restore report %+v: want a new client, well within the %v budget", rep, budget)
	}
	producePlain(t, addrs, "blc", vals("b", 5))
	wait.For(t, 15*time.Second, "the copy consuming", func() bool { return a.count("b-") == 5 })
	if live, _ := a.live.counts(); live != 1 {
		t.Errorf("%d kgo clients alive after the restore, want 1", live)
	}
}

// BlockRebalanceOnPoll, torn resume. The member's LeaveGroup gets no answer within the budget
// (the coordinator hangs): the checkpoint is refused after the member began
// leaving, and the resume closes that kgo client before it builds the next,
// so that the old one neither stays in the group nor lives beside the new.
func TestTornResumeClosesOldClient(t *testing.T) {
	kf := newKfake(t, 1, "tl")
	addrs := kf.ListenAddrs()
	producePlain(t, addrs, "tl", vals("a", 3))
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	kf.ControlKey(int16(kmsg.LeaveGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.SleepControl(func() { <-release })
		return nil, nil, false
	})
	reg := notify.NewRegistry()
	live := &liveClients{}
	c := newHooked(t, reg, groupOpts(addrs, "tl", "tl", kgo.WithHooks(live)))
	ctx := testCtx(t, 20*time.Second)
	got := kafkatest.PollValues(ctx, c, nil, 3)
	kcl0 := c.Underlying()
	res, err := reg.Simulate(ctx, notify.SimRestore, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.BeforeErr == nil || res.Event.Kind != notify.Resume {
		t.Fatalf("before error %v, event %v: want a refused checkpoint (the leave hangs)", res.BeforeErr, res.Event.Kind)
	}
	unblock()
	if c.Underlying() == kcl0 {
		t.Error("the resume kept a kgo client that began leaving its group")
	}
	select {
	case <-kcl0.Context().Done():
	default:
		t.Error("the resume did not close the kgo client that began leaving the group")
	}
	if live, mx := live.counts(); live != 1 || mx != 1 {
		t.Errorf("kgo clients: %d alive, at most %d at once; want 1 and 1", live, mx)
	}
	producePlain(t, addrs, "tl", vals("b", 3))
	got = kafkatest.PollValues(ctx, c, got, 6)
	if want := append(vals("a", 3), vals("b", 3)...); !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// BlockRebalanceOnPoll, consume-transform-produce. The application holds polled records when
// the checkpoint begins and produces while processing them: its Produce
// passes the gate while the hook waits for its AllowRebalance, the record
// is flushed before the dump, and the checkpoint succeeds.
func TestBlockRebalanceProduceWhileHeld(t *testing.T) {
	addrs := newCluster(t, 1, "bp", "bp-out")
	producePlain(t, addrs, "bp", vals("a", 3))
	release := make(chan struct{})
	a, reg, ctx := runMember(t, addrs, "bp", release)
	<-a.holding
	type result struct {
		res notify.SimResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := reg.Simulate(ctx, notify.SimRestore, 4*time.Second)
		done <- result{res, err}
	}()
	wait.For(t, 5*time.Second, "the checkpoint's gate closed", func() bool { return a.c.state.Load().gate != nil })
	if err := a.c.ProduceSync(ctx, &kgo.Record{Topic: "bp-out", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce while holding polled records during the checkpoint: %v", err)
	}
	close(release)
	r := <-done
	if r.err != nil || r.res.BeforeErr != nil || r.res.AfterErr != nil {
		t.Fatalf("cycle: %v, before %v, after %v", r.err, r.res.BeforeErr, r.res.AfterErr)
	}
	if got := kafkatest.ReadValues(t, addrs, "bp-out", 1); !slices.Equal(got, []string{"x"}) {
		t.Errorf("output %v, want [x]", got)
	}
}

// H1 with the broker gone. The broker becomes unreachable as the member
// leaves (connections closed, dials refused), so the member is still in the
// group when the next client starts. With kgo's Close done, the checkpoint
// goes on and a copy is restored; with a Close that goes on until the broker
// is back (an OnPartitionsRevoked that retries its commit), the checkpoint
// is refused and the resume does not wait for that Close. Either way, once the broker answers again, the new
// client removes the old member, whose session (45 s) would otherwise hold
// up the group's rebalance.
func TestLeaveFailedBrokerGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		at     kmsg.Key // the broker goes away when this request is written
		revoke bool
		want   notify.Kind
	}{
		{"restored", kmsg.LeaveGroup, false, notify.Restore},
		// The group is described (leavesGroupEmpty) just before the leave.
		{"refused", kmsg.DescribeGroups, true, notify.Resume},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kf := newKfake(t, 1, "tg")
			addrs := kf.ListenAddrs()
			producePlain(t, addrs, "tg", vals("a", 3))
			o := &outage{at: tc.at}
			extra := []kgo.Opt{kgo.Dialer(o.dial)}
			if tc.revoke {
				// A revoke that retries until the broker answers again.
				extra = append(extra, kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
					for o.down.Load() && ctx.Err() == nil {
						time.Sleep(10 * time.Millisecond)
					}
					cl.CommitUncommittedOffsets(ctx)
				}))
			}
			reg := notify.NewRegistry()
			c := newHooked(t, reg, groupOpts(addrs, "tg", "tg", extra...))
			ctx := testCtx(t, 60*time.Second)
			got := kafkatest.PollValues(ctx, c, nil, 3)
			member, _ := c.Underlying().GroupMetadata()
			o.armed.Store(true)
			const budget = 3 * time.Second
			res, err := reg.Simulate(ctx, notify.SimRestore, budget)
			if err != nil {
				t.Fatal(err)
			}
			if res.Event.Kind != tc.want {
				t.Fatalf("before error %v, event %v: want %v", res.BeforeErr, res.Event.Kind, tc.want)
			}
			rep, _ := c.Report()
			if rep.Restore == nil || !rep.NewClient || time.Duration(rep.DurationMS)*time.Millisecond > budget/2 {
				t.Errorf("after-restore report %+v: want a new client, well within the %v budget", rep, budget)
			}
			o.down.Store(false)
			back := time.Now()
			producePlain(t, addrs, "tg", vals("b", 3))
			pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			got = kafkatest.PollValues(pctx, c, got, 6)
			t.Logf("broker back → records polled: %v", time.Since(back).Round(time.Millisecond))
			if want := append(vals("a", 3), vals("b", 3)...); !slices.Equal(got, want) {
				t.Errorf("delivered %v, want %v (a member nobody removed holds up the rebalance)", got, want)
			}
			gs, err := kadm.NewClient(mustClient(t, addrs)).DescribeGroups(ctx, "tg")
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range gs["tg"].Members {
				if m.MemberID == member {
					t.Errorf("the old member %s is still in the group", member)
				}
			}
		})
	}
}

// outage is a kgo.Dialer whose broker goes away, once armed, when a request
// of kind at is written: every connection closes and dials are refused
// until down is cleared.
type outage struct {
	at          kmsg.Key
	armed, down atomic.Bool
	mu          sync.Mutex
	conns       []net.Conn
}

func (o *outage) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if o.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.conns = append(o.conns, conn)
	o.mu.Unlock()
	return &outageConn{conn, o}, nil
}

type outageConn struct {
	net.Conn
	o *outage
}

// Write sees whole requests: kgo writes each in one call (size, then
// api key).
func (c *outageConn) Write(b []byte) (int, error) {
	if len(b) >= 6 && int16(binary.BigEndian.Uint16(b[4:6])) == int16(c.o.at) && c.o.armed.Swap(false) {
		c.o.down.Store(true)
		c.o.mu.Lock()
		for _, conn := range c.o.conns {
			conn.Close()
		}
		c.o.conns = nil
		c.o.mu.Unlock()
	}
	if c.o.down.Load() {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}
