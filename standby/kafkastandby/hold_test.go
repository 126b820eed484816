package kafkastandby

import (
	"errors"
	"fmt"
	"slices"
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
)

// holdEnv is a kfake broker with topic "t" (3 partitions) and group "g",
// for the hold's own tests (standby's tests run it under the supervisor).
type holdEnv struct {
	t     *testing.T
	c     *kfake.Cluster
	addrs []string
	adm   *kadm.Client
}

func newHoldEnv(t *testing.T) *holdEnv {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(3, "t"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &holdEnv{t: t, c: c, addrs: addrs, adm: kadm.NewClient(cl)}
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

// placeholder joins a placeholder offering protocol to group "g" by hand,
// as a kcr standby's hold does, and returns its hold (whose client the
// caller closes: closed, the placeholder stays without heartbeats until its
// session ends) and member.
func (e *holdEnv) placeholder(protocol string) (*Hold, *holdMember) {
	e.t.Helper()
	o := testConfig(e.t, e.addrs)
	o.Group = "g"
	h, err := newHold(&o)
	if err != nil {
		e.t.Fatal(err)
	}
	h.saved.HoldProtocol = protocol
	m := &holdMember{}
	if err = h.memberID(e.t.Context(), m); err == nil {
		err = h.joinSync(e.t.Context(), m)
	}
	if err != nil {
		h.cl.Close()
		e.t.Fatalf("joining a placeholder by hand: %v", err)
	}
	return h, m
}

// The placeholder's leave fails (the broker is unreachable for longer than
// the leave's budget): it is tried again until it succeeds, so that the
// placeholder does not stay in the group for its whole session (30 s),
// holding up the rebalance of the restored member's join.
func TestGroupHoldLeaveRetried(t *testing.T) {
	e := newHoldEnv(t)
	var down atomic.Bool
	e.c.ControlKey(int16(kmsg.LeaveGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.c.KeepControl()
		if down.Load() {
			return nil, errors.New("broker down"), true
		}
		return nil, nil, false
	})
	h, m := e.placeholder("range")
	defer h.cl.Close()
	h.setMember(m.id)
	down.Store(true)
	h.leave(m.id) // fails within holdLeaveBudget
	if _, id := e.members(); id != m.id {
		t.Fatalf("placeholder %q in the group, want %q (its leave failed)", id, m.id)
	}
	down.Store(false)
	e.waitOnly(holdSession / 3)
	h.mu.Lock()
	saved := h.saved.HoldMember
	h.mu.Unlock()
	if saved != "" {
		t.Errorf("hold_member %q recorded after the placeholder left", saved)
	}
}

// The state file cannot record the placeholder (a full disk): it does not
// join, and the member id the broker handed out is removed, so that no
// placeholder a later kcr standby could not find is left in the group.
func TestGroupHoldUnrecordedPlaceholder(t *testing.T) {
	e := newHoldEnv(t)
	var left sync.Map // member ids named by a LeaveGroup
	e.c.ControlKey(int16(kmsg.LeaveGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		e.c.KeepControl()
		for _, m := range kr.(*kmsg.LeaveGroupRequest).Members {
			left.Store(m.MemberID, true)
		}
		return nil, nil, false
	})
	full := errors.New("write the state file: no space left on device")
	o := testConfig(t, e.addrs)
	o.Group = "g"
	var tries []holdSaved
	o.SaveHold = func(member, protocol string) error {
		tries = append(tries, holdSaved{member, protocol})
		return full
	}
	h, err := newHold(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer h.cl.Close()
	h.saved.HoldProtocol = "range"
	m := &holdMember{}
	err = h.memberID(t.Context(), m)
	if !errors.Is(err, full) || m.id != "" {
		t.Fatalf("memberID with the state file full: id %q, err %v; want no member and the write's error", m.id, err)
	}
	if len(tries) == 0 || tries[0].HoldMember == "" {
		t.Fatalf("state file writes %+v: the placeholder's member id was never offered", tries)
	}
	id := tries[0].HoldMember
	if _, ok := left.Load(id); !ok {
		t.Errorf("member id %q the broker handed out was not removed", id)
	}
	if _, ph := e.members(); ph != "" {
		t.Errorf("placeholder %q in the group", ph)
	}
}

// The first join asks for a short session: its pending member is what a
// kcr standby killed before it recorded the id leaves behind, and every
// rebalance waits for it until that session ends. The join that makes the
// member asks for holdSession; so does a first join again where the broker
// refuses the short session.
func TestGroupHoldPendingSession(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refuse), func(t *testing.T) {
			e := newHoldEnv(t)
			var mu sync.Mutex
			var first, second []int32
			e.c.ControlKey(int16(kmsg.JoinGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				e.c.KeepControl()
				req := kr.(*kmsg.JoinGroupRequest)
				mu.Lock()
				defer mu.Unlock()
				if req.MemberID != "" {
					second = append(second, req.SessionTimeoutMillis)
					return nil, nil, false
				}
				first = append(first, req.SessionTimeoutMillis)
				if refuse && req.SessionTimeoutMillis < int32(holdSession.Milliseconds()) {
					resp := req.ResponseKind().(*kmsg.JoinGroupResponse)
					resp.ErrorCode = kerr.InvalidSessionTimeout.Code
					return resp, nil, true
				}
				return nil, nil, false
			})
			h, _ := e.placeholder("range")
			defer h.cl.Close()
			mu.Lock()
			defer mu.Unlock()
			short, long := int32(holdPendingSession.Milliseconds()), int32(holdSession.Milliseconds())
			wantFirst := []int32{short}
			if refuse {
				wantFirst = append(wantFirst, long)
			}
			if !slices.Equal(first, wantFirst) || !slices.Equal(second, []int32{long}) {
				t.Fatalf("session timeouts asked: first joins %v, member's join %v; want %v and [%d]", first, second, wantFirst, long)
			}
		})
	}
}
