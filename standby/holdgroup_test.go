package standby

import (
	"context"
	"errors"
	"path/filepath"
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
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/standby/kafkastandby"
)

// initialDelay is the emulated group.initial.rebalance.delay.ms, Kafka's
// default.
const initialDelay = 3 * time.Second

// holdEnv is a kfake broker with topic "t" (3 partitions) and group "g",
// which committed its end offsets, for the group hold's tests.
type holdEnv struct {
	t     *testing.T
	c     *kfake.Cluster
	addrs []string
	cl    *kgo.Client
	adm   *kadm.Client
	delay *kafkatest.RebalanceDelay // nil without the initial delay
	joins atomic.Int32              // JoinGroup requests that make a member
}

func newHoldEnv(t *testing.T, delayed bool) *holdEnv {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(3, "t"))
	e := &holdEnv{t: t, c: c, addrs: addrs}
	c.ControlKey(int16(kmsg.JoinGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		if req := kr.(*kmsg.JoinGroupRequest); req.MemberID != "" {
			e.joins.Add(1)
		}
		return nil, nil, false
	})
	if delayed {
		e.delay = kafkatest.InitialRebalanceDelay(t, c, initialDelay)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.cl, e.adm = cl, kadm.NewClient(cl)
	kafkatest.Produce(t, addrs, "t", 3)
	ends, err := e.adm.ListEndOffsets(t.Context(), "t")
	if err != nil {
		t.Fatal(err)
	}
	offs := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) { offs.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset}) })
	if _, err := e.adm.CommitOffsets(t.Context(), "g", offs); err != nil {
		t.Fatal(err)
	}
	return e
}

// withGroup sets the supervisor's group options for e's broker.
func (e *holdEnv) withGroup(more func(*Options)) func(*Options) {
	return func(o *Options) {
		o.Brokers, o.Group, o.Topics, o.Poll, o.BrokerTimeout = e.addrs, "g", []string{"t"}, 20*time.Millisecond, 2*time.Second
		if more != nil {
			more(o)
		}
	}
}

// members returns the client ids of the group's members, and the member
// id of the placeholder ("" if it is not in the group).
func (e *holdEnv) members() (clients []string, placeholder string) {
	ds, err := e.adm.DescribeGroups(e.t.Context(), "g")
	if err != nil {
		e.t.Fatal(err)
	}
	for _, m := range ds["g"].Members {
		clients = append(clients, m.ClientID)
		if m.ClientID == holdClientID {
			placeholder = m.MemberID
		}
	}
	return clients, placeholder
}

func (e *holdEnv) waitPlaceholder(d time.Duration) string {
	e.t.Helper()
	var id string
	wait.For(e.t, d, "the placeholder in the group", func() bool {
		_, id = e.members()
		return id != ""
	})
	return id
}

// The hold's client id and timing, as package kafkastandby has them.
const (
	holdClientID  = "kcr-standby-hold"
	holdSession   = 30 * time.Second
	holdRebalance = 10 * time.Second
	// holdBeatAsleep: the placeholder heartbeats this often while the
	// service sleeps.
	holdBeatAsleep = 2 * time.Second
)

// leftPlaceholder joins a placeholder offering protocol to group "g" by
// hand, as a kcr standby's hold does, and leaves it there without
// heartbeats (its kcr standby was killed): it stays until its session
// ends. It returns its member id.
func (e *holdEnv) leftPlaceholder(protocol string) string {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.ClientID(holdClientID))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.ProtocolType = "g", "consumer"
	join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = int32(holdSession.Milliseconds()), int32(holdRebalance.Milliseconds())
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{"t"}
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = protocol, meta.AppendTo(nil)
	join.Protocols = []kmsg.JoinGroupRequestProtocol{p}
	resp, err := join.RequestWith(e.t.Context(), cl)
	if err == nil && errors.Is(kerr.ErrorForCode(resp.ErrorCode), kerr.MemberIDRequired) {
		join.MemberID = resp.MemberID
		resp, err = join.RequestWith(e.t.Context(), cl)
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		e.t.Fatalf("joining a placeholder by hand: %v", err)
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.Generation, sync.MemberID = "g", resp.Generation, resp.MemberID
	sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), resp.Protocol
	sresp, err := sync.RequestWith(e.t.Context(), cl)
	if err == nil {
		err = kerr.ErrorForCode(sresp.ErrorCode)
	}
	if err != nil {
		e.t.Fatalf("syncing a placeholder by hand: %v", err)
	}
	return resp.MemberID
}

// leave removes member from group "g", as an admin would.
func (e *holdEnv) leave(member string) {
	e.t.Helper()
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = member
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group, req.Members = "g", []kmsg.LeaveGroupRequestMember{m}
	resp, err := req.RequestWith(e.t.Context(), e.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		e.t.Fatalf("removing %s from the group: %v", member, err)
	}
}

// waitOnly waits until the group's members are exactly clients.
func (e *holdEnv) waitOnly(d time.Duration, clients ...string) {
	e.t.Helper()
	var got []string
	if !wait.Until(d, func() bool {
		got, _ = e.members()
		return slices.Equal(got, clients)
	}) {
		e.t.Fatalf("group members %v, want %v", got, clients)
	}
}

// member starts a franz-go member of group "g" (the restored service) and
// returns it with a channel closed once it was assigned all 3 partitions.
func (e *holdEnv) member(clientID string, opts ...kgo.Opt) (*kgo.Client, <-chan struct{}) {
	e.t.Helper()
	all := make(chan struct{})
	var n atomic.Int32
	var once sync.Once
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.addrs...), kgo.ClientID(clientID),
		kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			if n.Add(int32(len(a["t"]))) >= 3 {
				once.Do(func() { close(all) })
			}
		})}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	// A member joins when the client polls.
	go func() {
		for {
			if fs := cl.PollFetches(context.Background()); fs.IsClientClosed() {
				return
			}
		}
	}()
	return cl, all
}

// assigned waits for all, and returns how long it took since start.
func assigned(t *testing.T, all <-chan struct{}, start time.Time, d time.Duration) time.Duration {
	t.Helper()
	select {
	case <-all:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("the member was not assigned all partitions within %v", d)
		return 0
	}
}

func hasResult(r *rig, res string) bool { return slices.Contains(r.rec.holdResults(), res) }

// service starts the service's member of group "g" (it pays the initial
// delay: the group is empty) and makes the fake's checkpoint close it, as
// the service's hooks make it leave the group.
func (e *holdEnv) service(f *fake, clientID string, opts ...kgo.Opt) {
	e.t.Helper()
	cl, all := e.member(clientID, opts...)
	assigned(e.t, all, time.Now(), 3*initialDelay)
	f.onCheckpoint = cl.Close
}

// renamedRange is a custom assignor: range under another protocol name.
type renamedRange struct{ kgo.GroupBalancer }

func (renamedRange) ProtocolName() string { return "kcr-test-range" }

// The placeholder joins while the service's member is still in the group,
// and stays alone in it when that member leaves: whenever the wake comes
// (at once, or after the hold settled), the restored member's join is an
// ordinary rebalance, the placeholder is removed as soon as it started,
// and no join after the service's first ever waits for the initial delay.
// The placeholder offers the service's own protocol, a custom one
// included.
func TestGroupHold(t *testing.T) {
	for _, c := range []struct {
		name     string
		opts     []kgo.Opt
		protocol string
		settle   bool // wake once the hold settled; else at once
	}{
		{"settled", nil, "cooperative-sticky", true},
		{"at-once", nil, "cooperative-sticky", false},
		{"custom-assignor", []kgo.Opt{kgo.Balancers(renamedRange{kgo.RangeBalancer()})}, "kcr-test-range", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newHoldEnv(t, true)
			f := newFake()
			e.service(f, "svc", c.opts...)
			r := startRig(t, f, filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
			r.waitState(StateStandby)
			if c.settle {
				wait.For(t, 10*time.Second, "the hold held", func() bool { return hasResult(r, kafkastandby.HoldHeld) })
				e.waitOnly(10*time.Second, holdClientID)
				st, _ := r.s.dir.readState()
				if _, id := e.members(); st.HoldMember != id || st.HoldProtocol != c.protocol {
					t.Errorf("state file hold %+v, want member %q protocol %q", st.holdSaved, id, c.protocol)
				}
				// The documented cost: a held group cannot be deleted.
				if _, err := e.adm.DeleteGroup(t.Context(), "g"); !errors.Is(err, kerr.NonEmptyGroup) {
					t.Errorf("deleting the held group: %v, want NON_EMPTY_GROUP", err)
				}
				kafkatest.Produce(t, e.addrs, "t", 1) // held, the group's lag still wakes the service
				r.waitState(StateRunning)
			} else if !r.s.Wake("manual") {
				t.Fatal("the supervisor is not asleep")
			}
			start := time.Now()
			_, all := e.member("svc", c.opts...)
			took := assigned(t, all, start, 4*initialDelay)
			t.Logf("restored member assigned all partitions %v after joining (initial delay %v)", took, initialDelay)
			if n := e.delay.Held(); n != 1 {
				t.Errorf("the initial delay held %d joins, want 1 (the service's first)", n)
			}
			e.waitOnly(5*time.Second, "svc")
			wait.For(t, 5*time.Second, "the hold released", func() bool { return hasResult(r, kafkastandby.HoldReleased) })
			if st, _ := r.s.dir.readState(); st.HoldMember != "" {
				t.Errorf("state file hold_member %q after the placeholder left", st.HoldMember)
			}
		})
	}
}

// Two instances of the service in one group, each under its kcr standby,
// sleep together: their placeholders settle in the group at once, with no
// initial delay; the first wake removes them.
func TestGroupHoldTwoHolds(t *testing.T) {
	e := newHoldEnv(t, true)
	f1, f2 := newFake(), newFake()
	e.service(f1, "svc1")
	cl2, _ := e.member("svc2") // shares the partitions with svc1
	f2.onCheckpoint = cl2.Close
	wait.For(t, 20*time.Second, "both services in the group", func() bool {
		ds, err := e.adm.DescribeGroups(t.Context(), "g")
		return err == nil && ds["g"].State == "Stable" && len(ds["g"].Members) == 2
	})
	r1 := startRig(t, f1, filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r2 := startRig(t, f2, filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r1.waitState(StateStandby)
	r2.waitState(StateStandby)
	// One placeholder or both: a placeholder that leads the group while
	// the other service's member is still in leaves it to that member,
	// whose own placeholder joins before it leaves.
	wait.For(t, 10*time.Second, "only placeholders in the group", func() bool {
		clients, _ := e.members()
		return len(clients) > 0 && !slices.ContainsFunc(clients, func(c string) bool { return c != holdClientID })
	})
	if !r1.s.Wake("manual") {
		t.Fatal("the first supervisor is not asleep")
	}
	_, all := e.member("svc1")
	select {
	case <-all:
	case <-time.After(4 * initialDelay):
		t.Fatalf("not assigned\n%s\n%s", r1.log.String(), r2.log.String())
	}
	e.waitOnly(5*time.Second, "svc1")
	if n := e.delay.Held(); n != 1 {
		t.Errorf("the initial delay held %d joins, want 1 (the first service's first)", n)
	}
	for _, r := range []*rig{r1, r2} {
		if hasResult(r, kafkastandby.HoldFailed) {
			t.Errorf("a hold failed:\n%s", r.log.String())
		}
	}
}

// No group (a KIP-848 group that expired, or was deleted, while the
// service ran), or a KIP-848 one: the hold never joins, so it never
// creates a group nor turns one classic.
func TestGroupHoldSkips(t *testing.T) {
	t.Run("no-group", func(t *testing.T) {
		e := newHoldEnv(t, false)
		r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(func(o *Options) { o.Group = "gone" }))
		r.waitState(StateStandby)
		wait.For(t, 5*time.Second, "the hold skipped", func() bool { return hasResult(r, kafkastandby.HoldSkipped) })
		if n := e.joins.Load(); n != 0 {
			t.Fatalf("%d joins into a missing group", n)
		}
		if lg, err := e.adm.ListGroups(t.Context()); err != nil || slices.Contains(lg.Groups(), "gone") {
			t.Fatalf("groups %v (%v): the hold created one", lg.Groups(), err)
		}
	})
	t.Run("kip848", func(t *testing.T) {
		e := newHoldEnv(t, false)
		f := newFake()
		e.service(f, "svc848", kgo.ServerSideBalancer())
		r := startRig(t, f, filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
		r.waitState(StateStandby)
		wait.For(t, 5*time.Second, "the hold skipped", func() bool { return hasResult(r, kafkastandby.HoldSkipped) })
		if !strings.Contains(r.log.String(), "KIP-848") {
			t.Errorf("the skip does not say why:\n%s", r.log.String())
		}
		if n := e.joins.Load(); n != 0 {
			t.Fatalf("%d classic joins into a KIP-848 group", n)
		}
	})
}

// The coordinator fails the placeholder's heartbeats for a while (it
// moves, or its broker restarts): the placeholder stays in the group, and
// the restored member still finds it held.
func TestGroupHoldCoordinatorErrors(t *testing.T) {
	e := newHoldEnv(t, true)
	f := newFake()
	e.service(f, "svc")
	var failing atomic.Int32
	e.c.ControlKey(int16(kmsg.Heartbeat), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		e.c.KeepControl()
		if failing.Load() <= 0 {
			return nil, nil, false
		}
		failing.Add(-1)
		resp := kr.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.NotCoordinator.Code
		return resp, nil, true
	})
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	e.waitOnly(10*time.Second, holdClientID)
	_, id := e.members()
	failing.Store(3)
	wait.For(t, 20*time.Second, "the failed heartbeats", func() bool { return failing.Load() <= 0 })
	time.Sleep(2 * holdBeatAsleep) // heartbeats go on
	if _, now := e.members(); now != id {
		t.Fatalf("placeholder %q in the group, want %q, which stayed:\n%s", now, id, r.log.String())
	}
	r.s.Wake("manual")
	_, all := e.member("svc")
	assigned(t, all, time.Now(), 4*initialDelay)
	if n := e.delay.Held(); n != 1 {
		t.Errorf("the initial delay held %d joins, want 1", n)
	}
}

// kcr standby killed while holding the group left its placeholder there:
// the next kcr standby removes it first (it would otherwise stay until its
// session times out). And a kcr standby that stops leaves the group.
func TestGroupHoldSweepsLeftPlaceholder(t *testing.T) {
	e := newHoldEnv(t, false)
	dir := filepath.Join(t.TempDir(), "img")
	f := newFake()
	e.service(f, "svc")
	r := startRig(t, f, dir, e.withGroup(nil))
	r.waitState(StateStandby)
	e.waitOnly(5*time.Second, holdClientID)
	r.end()
	e.waitOnly(time.Second) // left on stop: no member

	// A placeholder whose kcr standby was killed: in the group, no
	// heartbeats, no leave, its member id in the state file.
	id := e.leftPlaceholder("range")
	d := &imageDir{path: dir}
	st, err := d.readState()
	if err != nil {
		t.Fatal(err)
	}
	st.HoldMember = id
	if err := d.writeState(st); err != nil {
		t.Fatal(err)
	}
	if _, in := e.members(); in != id {
		t.Fatalf("placeholder %q in the group, want the left one %q", in, id)
	}
	r2 := startRig(t, newFake(), dir, e.withGroup(nil))
	r2.waitState(StateStandby)
	e.waitOnly(5 * time.Second)
	if !strings.Contains(r2.log.String(), "removed the placeholder an earlier kcr standby left") {
		t.Errorf("the sweep is not logged:\n%s", r2.log.String())
	}
	if st, _ := d.readState(); st.HoldMember != "" {
		t.Errorf("state file hold_member %q after the sweep", st.HoldMember)
	}
}

// --hold-group=false: no placeholder, and the restored member pays the
// initial delay (which shows that the emulated delay is real).
func TestGroupHoldOff(t *testing.T) {
	e := newHoldEnv(t, true)
	f := newFake()
	e.service(f, "svc")
	joins := e.joins.Load()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), e.withGroup(func(o *Options) { o.NoHoldGroup = true }))
	r.waitState(StateStandby)
	if n := e.joins.Load() - joins; n != 0 {
		t.Fatalf("%d joins with the hold off", n)
	}
	if res := r.rec.holdResults(); len(res) != 0 {
		t.Fatalf("hold results %v with the hold off", res)
	}
	r.s.Wake("manual")
	r.waitState(StateRunning)
	start := time.Now()
	_, all := e.member("svc")
	took := assigned(t, all, start, 4*initialDelay)
	t.Logf("restored member assigned all partitions %v after joining (initial delay %v)", took, initialDelay)
	if took < initialDelay {
		t.Errorf("the member took %v, less than the emulated initial delay %v", took, initialDelay)
	}
}

// The load the hold adds to the broker while the service sleeps: a
// heartbeat every two seconds.
func TestGroupHoldLoad(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[hold], func(t *testing.T) {
			e := newHoldEnv(t, false)
			f := newFake()
			e.service(f, "svc")
			obs := &countingObserver{}
			r := startRig(t, f, filepath.Join(t.TempDir(), "img"), e.withGroup(func(o *Options) {
				o.NoHoldGroup, o.Poll, o.Observer = !hold, 100*time.Millisecond, obs
			}))
			r.waitState(StateStandby)
			if hold {
				e.waitOnly(5*time.Second, holdClientID)
			}
			n0, t0 := obs.requests(), time.Now()
			time.Sleep(3 * time.Second)
			rate := float64(obs.requests()-n0) / time.Since(t0).Seconds()
			t.Logf("hold %v, --poll 100ms: %.1f broker requests/s asleep", hold, rate)
			if rate > 15 {
				t.Errorf("%.1f requests/s", rate)
			}
		})
	}
}

// The service woken while no hold of this kcr standby runs (it was
// skipped: the group was empty at the checkpoint), and a placeholder is in
// the group that nobody heartbeats (a restarted broker restored it from
// the last completed generation): it is removed once the restored member
// joined, instead of holding up that member's rebalance for its session.
func TestGroupHoldReleasesRestoredPlaceholder(t *testing.T) {
	e := newHoldEnv(t, false)
	var left sync.Map
	e.c.ControlKey(int16(kmsg.LeaveGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		e.c.KeepControl()
		for _, m := range kr.(*kmsg.LeaveGroupRequest).Members {
			left.Store(m.MemberID, true)
		}
		return nil, nil, false
	})
	r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	if !slices.Contains(r.rec.holdResults(), kafkastandby.HoldSkipped) {
		t.Fatalf("hold results %v, want it skipped (no member at the checkpoint)", r.rec.holdResults())
	}

	// The zombie: in the group, never heartbeating, in no state file.
	id := e.leftPlaceholder("cooperative-sticky")

	r.s.Wake("manual")
	r.waitState(StateRunning)
	_, all := e.member("svc") // the restored service's member
	assigned(t, all, time.Now(), holdSession)
	if _, ok := left.Load(id); !ok {
		t.Errorf("the placeholder nobody heartbeats (%s) was not removed; hold results %v", id, r.rec.holdResults())
	}
	e.waitOnly(5*time.Second, "svc")
}
