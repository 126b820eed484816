package standby

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/standby/kafkastandby"
)

// Replicas that go idle together each see the other in the group when
// they checkpoint. Each one's placeholder joins before its member leaves,
// and one stays: the group is never empty, no placeholder's join waits
// out the broker's initial delay, and the first wake after the collective
// sleep is an ordinary rebalance. So too when the second sleeps later,
// and sees only its own member in the group: its placeholder is one of
// two, and one stays.
func TestGroupHoldReplicasSleepTogether(t *testing.T) {
	for _, together := range []bool{true, false} {
		t.Run(map[bool]string{true: "together", false: "one-after-the-other"}[together], func(t *testing.T) {
			testReplicasSleep(t, together)
		})
	}
}

func testReplicasSleep(t *testing.T, together bool) {
	e := newHoldEnv(t, true)
	f1, f2 := newFake(), newFake()
	e.service(f1, "svc1")
	cl2, _ := e.member("svc2")
	wait.For(t, 20*time.Second, "both services in the group", func() bool {
		ds, err := e.adm.DescribeGroups(t.Context(), "g")
		return err == nil && ds["g"].State == "Stable" && len(ds["g"].Members) == 2
	})
	f2.onCheckpoint = cl2.Close
	idle2 := 150 * time.Millisecond
	if together {
		// Both checkpoints are under way before either member leaves:
		// each one's look at the group before it sees the other.
		var both sync.WaitGroup
		both.Add(2)
		var once1, once2 sync.Once
		cl1 := f1.onCheckpoint
		f1.onCheckpoint = func() { once1.Do(func() { both.Done(); both.Wait() }); cl1() }
		f2.onCheckpoint = func() { once2.Do(func() { both.Done(); both.Wait() }); cl2.Close() }
	} else {
		idle2 = 2 * time.Second
	}
	replicas := func(idle time.Duration) func(*Options) {
		return e.withGroup(func(o *Options) {
			o.Replicas, o.ReplicasTopic, o.MinWake, o.ScaleUpAfter, o.Idle = true, "claims", 1, 10*time.Second, idle
		})
	}
	r1 := startRig(t, f1, filepath.Join(t.TempDir(), "img"), replicas(150*time.Millisecond))
	r2 := startRig(t, f2, filepath.Join(t.TempDir(), "img"), replicas(idle2))
	r1.waitState(StateStandby)
	r2.waitState(StateStandby)
	wait.For(t, 15*time.Second, "one placeholder alone in the group", func() bool {
		clients, _ := e.members()
		return slices.Equal(clients, []string{holdClientID})
	})
	if n := e.delay.Held(); n != 1 {
		t.Fatalf("the initial delay held %d joins, want 1 (the first service's first): a placeholder joined the empty group\n%s\n%s", n, r1.log.String(), r2.log.String())
	}
	if !r1.s.Wake("manual") {
		t.Fatal("the first supervisor is not asleep")
	}
	start := time.Now()
	_, all := e.member("svc1")
	if d := assigned(t, all, start, 4*initialDelay); d >= initialDelay {
		t.Errorf("the first wake after the collective sleep took %v: it waited for the initial delay", d)
	}
	e.waitOnly(5*time.Second, "svc1")
	if n := e.delay.Held(); n != 1 {
		t.Errorf("the initial delay held %d joins, want 1", n)
	}
	for _, r := range []*rig{r1, r2} {
		if hasResult(r, kafkastandby.HoldFailed) {
			t.Errorf("a hold failed:\n%s", r.log.String())
		}
	}
}

// A placeholder that joins an empty group (removed while the service
// sleeps, the group emptied) offers a rebalance timeout no longer than
// the broker's default initial delay: the broker extends the delay for
// each member that joins inside it only while the first member's
// rebalance timeout exceeds it, so the restored member's join inside the
// delay never waits for a second one. Later joins offer holdRebalance.
func TestGroupHoldEmptyJoinRebalanceTimeout(t *testing.T) {
	e := newHoldEnv(t, false)
	var mu sync.Mutex
	var joins []int32 // the placeholder's joins that make it a member
	e.c.ControlKey(int16(kmsg.JoinGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		e.c.KeepControl()
		if req := kr.(*kmsg.JoinGroupRequest); req.MemberID != "" && strings.HasPrefix(req.MemberID, holdClientID+"-") {
			mu.Lock()
			joins = append(joins, req.RebalanceTimeoutMillis)
			mu.Unlock()
		}
		return nil, nil, false
	})
	f := newFake()
	e.service(f, "svc")
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), e.withGroup(nil))
	r.waitState(StateStandby)
	id := e.waitPlaceholder(10 * time.Second)
	mu.Lock()
	armed := slices.Clone(joins)
	mu.Unlock()
	if len(armed) == 0 || slices.ContainsFunc(armed, func(ms int32) bool { return ms != int32(holdRebalance.Milliseconds()) }) {
		t.Errorf("the armed placeholder's joins offered rebalance timeouts %v ms, want %v", armed, holdRebalance)
	}
	// Removed: its next heartbeat finds the group empty, and it joins again.
	e.leave(id)
	wait.For(t, 15*time.Second, "a new placeholder in the group", func() bool {
		_, now := e.members()
		return now != "" && now != id
	})
	mu.Lock()
	defer mu.Unlock()
	empty := joins[len(armed)]
	if empty > int32(initialDelay.Milliseconds()) {
		t.Errorf("the join into the empty group offered a rebalance timeout of %d ms, want %v at most (all joins: %v)", empty, initialDelay, joins)
	}
}
