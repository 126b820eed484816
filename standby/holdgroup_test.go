package standby

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
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
	e.adm = kadm.NewClient(cl)
	produce(t, addrs, "t", 3)
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
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.addrs...), kgo.ClientID(clientID),
		kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			if n.Add(int32(len(a["t"]))) == 3 {
				close(all)
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

// The service sleeps: the placeholder joins its group (paying the broker's
// initial delay itself), the lag of a new record wakes the service, the
// restored member joins, the placeholder leaves, and the member has all
// partitions well before the initial delay would have passed.
func TestGroupHold(t *testing.T) {
	e := newHoldEnv(t, true)
	r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	id := e.waitPlaceholder(initialDelay + 5*time.Second)
	wait.For(t, 5*time.Second, "the hold held", func() bool { return hasResult(r, HoldHeld) })
	if st, _ := r.s.dir.readState(); st.HoldMember != id {
		t.Errorf("state file hold_member %q, want the placeholder's %q", st.HoldMember, id)
	}
	// The documented cost: a held group cannot be deleted.
	if _, err := e.adm.DeleteGroup(t.Context(), "g"); !errors.Is(err, kerr.NonEmptyGroup) {
		t.Errorf("deleting the held group: %v, want NON_EMPTY_GROUP", err)
	}
	produce(t, e.addrs, "t", 1) // held, the group's lag still wakes the service
	r.waitState(StateRunning)
	if !strings.Contains(r.log.String(), `"source":"kafka"`) {
		t.Fatalf("not woken by Kafka lag:\n%s", r.log.String())
	}
	start := time.Now()
	_, all := e.member("svc")
	took := assigned(t, all, start, 2*initialDelay)
	t.Logf("restored member assigned all partitions %v after joining (initial delay %v)", took, initialDelay)
	if took >= initialDelay*2/3 {
		t.Errorf("the member took %v to get its partitions: the initial delay (%v) was not avoided", took, initialDelay)
	}
	e.waitOnly(5*time.Second, "svc")
	wait.For(t, 5*time.Second, "the hold released", func() bool { return hasResult(r, HoldReleased) })
	if st, _ := r.s.dir.readState(); st.HoldMember != "" {
		t.Errorf("state file hold_member %q after the placeholder left", st.HoldMember)
	}
}

// The wake comes while the placeholder's own join is held by the initial
// delay: the restored member joins into the same delay, the placeholder
// leaves as soon as its join returns, and the member gets every partition
// within about one delay.
func TestGroupHoldWokenDuringJoin(t *testing.T) {
	e := newHoldEnv(t, true)
	r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	wait.For(t, 5*time.Second, "the placeholder's join held by the delay", func() bool { return e.delay.Holding() > 0 })
	if !r.s.Wake("manual") {
		t.Fatal("the supervisor is not asleep")
	}
	start := time.Now()
	_, all := e.member("svc", kgo.Balancers(kgo.RangeBalancer()))
	took := assigned(t, all, start, 4*initialDelay)
	t.Logf("restored member assigned all partitions %v after joining (initial delay %v)", took, initialDelay)
	if took >= 2*initialDelay {
		t.Errorf("the member took %v to get its partitions, two initial delays", took)
	}
	e.waitOnly(5*time.Second, "svc")
	wait.For(t, 5*time.Second, "the hold released", func() bool { return hasResult(r, HoldReleased) })
}

// kcr standby killed while holding the group left its placeholder there:
// the next kcr standby removes it first (it would otherwise stay until its
// session times out, 10 s), then holds the group with a new one. And a
// kcr standby that stops leaves the group.
func TestGroupHoldSweepsLeftPlaceholder(t *testing.T) {
	e := newHoldEnv(t, false)
	dir := filepath.Join(t.TempDir(), "img")
	r := startRig(t, newFake(), dir, e.withGroup(nil))
	r.waitState(StateStandby)
	e.waitPlaceholder(5 * time.Second)
	r.end()
	e.waitOnly(time.Second) // left on stop: no member

	// A placeholder whose kcr standby was killed: in the group, no
	// heartbeats, no leave, its member id in the state file.
	o := Options{Brokers: e.addrs, Group: "g", Observer: nopObserver{}}
	h, err := newGroupHold(&o, slog.New(slog.DiscardHandler), func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	j, others, err := h.join(t.Context(), []string{"t"})
	if err == nil && !others {
		err = h.sync(t.Context(), j)
	}
	h.cl.Close()
	if err != nil || others {
		t.Fatalf("joining a placeholder by hand: %v (others %v)", err, others)
	}
	d := &imageDir{path: dir}
	st, err := d.readState()
	if err != nil {
		t.Fatal(err)
	}
	st.HoldMember = j.member
	if err := d.writeState(st); err != nil {
		t.Fatal(err)
	}
	if _, id := e.members(); id != j.member {
		t.Fatalf("placeholder %q in the group, want the left one %q", id, j.member)
	}

	r2 := startRig(t, newFake(), dir, e.withGroup(nil))
	r2.waitState(StateStandby)
	var id string
	wait.For(t, 5*time.Second, "a new placeholder instead of the left one", func() bool {
		clients, p := e.members()
		id = p
		return len(clients) == 1 && p != "" && p != j.member
	})
	if !strings.Contains(r2.log.String(), "removed the placeholder an earlier kcr standby left") {
		t.Errorf("the sweep is not logged:\n%s", r2.log.String())
	}
	wait.For(t, 5*time.Second, "the new placeholder in the state file", func() bool {
		st, _ := d.readState()
		return st.HoldMember == id
	})
}

// Another member keeps the group from being empty while the service
// sleeps: the placeholder does not join until it has left.
func TestGroupHoldWaitsForEmptyGroup(t *testing.T) {
	e := newHoldEnv(t, false)
	other, all := e.member("other")
	assigned(t, all, time.Now(), 10*time.Second)
	r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	wait.For(t, 5*time.Second, "the hold waiting", func() bool {
		return strings.Contains(r.log.String(), "the group has members; holding it once it is empty")
	})
	if clients, _ := e.members(); !slices.Equal(clients, []string{"other"}) || e.joins.Load() != 1 {
		t.Fatalf("members %v after %d joins, want only the other member", clients, e.joins.Load())
	}
	other.Close() // leaves the group
	e.waitPlaceholder(5 * time.Second)
	e.waitOnly(time.Second, holdClientID)
	wait.For(t, 5*time.Second, "the hold held", func() bool { return hasResult(r, HoldHeld) })
}

// --hold-group=false: no placeholder, and the restored member pays the
// initial delay (which shows that the emulated delay is real).
func TestGroupHoldOff(t *testing.T) {
	e := newHoldEnv(t, true)
	r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(func(o *Options) { o.NoHoldGroup = true }))
	r.waitState(StateStandby)
	time.Sleep(holdEmptyPoll + 500*time.Millisecond) // a hold would have joined by now
	if n := e.joins.Load(); n != 0 {
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

// A KIP-848 group has no initial delay: nothing to hold, and the
// placeholder never joins.
func TestGroupHoldSkipsKIP848(t *testing.T) {
	e := newHoldEnv(t, false)
	m, all := e.member("svc848", kgo.ServerSideBalancer())
	assigned(t, all, time.Now(), 10*time.Second)
	m.Close()
	r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	wait.For(t, 5*time.Second, "the hold skipped", func() bool { return hasResult(r, HoldSkipped) })
	if !strings.Contains(r.log.String(), "KIP-848") {
		t.Errorf("the skip does not say why:\n%s", r.log.String())
	}
	if n := e.joins.Load(); n != 0 {
		t.Fatalf("%d classic joins into a KIP-848 group", n)
	}
	produce(t, e.addrs, "t", 1)
	r.waitState(StateRunning)
}

// The load the hold adds to the broker while the service sleeps: a
// heartbeat a second.
func TestGroupHoldLoad(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[hold], func(t *testing.T) {
			e := newHoldEnv(t, false)
			obs := &countingObserver{}
			r := startRig(t, newFake(), filepath.Join(t.TempDir(), "img"), e.withGroup(func(o *Options) {
				o.NoHoldGroup, o.Poll, o.Observer = !hold, 100*time.Millisecond, obs
			}))
			r.waitState(StateStandby)
			if hold {
				e.waitPlaceholder(5 * time.Second)
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
