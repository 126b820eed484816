package kafkastandby

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// replicaRig is a kfake broker with topic "t" (2 partitions).
type replicaRig struct {
	t       *testing.T
	addrs   []string
	cl      *kgo.Client
	scaleUp time.Duration // the next replicas' --scale-up-after (default 10 s)
}

func newReplicaRig(t *testing.T) *replicaRig {
	addrs, cl := fakeKafka(t)
	return &replicaRig{t: t, addrs: addrs, cl: cl}
}

// produce writes n records to each partition, written at ts.
func (r *replicaRig) produce(n int, ts time.Time) {
	r.t.Helper()
	for p := range int32(2) {
		for range n {
			if err := r.cl.ProduceSync(r.t.Context(), &kgo.Record{Topic: "t", Partition: p, Value: []byte("x"), Timestamp: ts}).FirstErr(); err != nil {
				r.t.Fatal(err)
			}
		}
	}
}

// member puts a live member (that processes nothing) in group.
func (r *replicaRig) member(group string) {
	r.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics("t"),
		kgo.DisableAutoCommit(), kgo.ClientID("service"))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(cl.Close)
	adm := kadm.NewClient(r.cl)
	for {
		ds, err := adm.DescribeGroups(r.t.Context(), group)
		if err == nil && ds[group].State == "Stable" && len(ds[group].Members) == 1 {
			return
		}
		select {
		case <-r.t.Context().Done():
			r.t.Fatal("the member did not join")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// replica is one replica's Kafka wake, as its kcr standby has it.
func (r *replicaRig) replica(group, name string) *Replica {
	r.t.Helper()
	o := testConfig(r.t, r.addrs)
	o.ImageDir = filepath.Join(r.t.TempDir(), name)
	o.Group, o.Topics, o.Replicas, o.ReplicasTopic, o.ScaleUpAfter = group, []string{"t"}, true, "claims", cmp.Or(r.scaleUp, 10*time.Second)
	k, err := newKafkaSource(r.t.Context(), &o)
	if err != nil {
		r.t.Fatal(err)
	}
	rs, err := newReplica(r.t.Context(), &o, k)
	if err != nil {
		k.Close()
		r.t.Fatal(err)
	}
	r.t.Cleanup(rs.Close)
	// The watcher's first reading: records from now on are work (a
	// partition never committed counts from there).
	if _, _, err := k.w.Pending(r.t.Context()); err != nil {
		r.t.Fatal(err)
	}
	return rs
}

// settle makes rs see the group's members as unchanged for longer than
// --scale-up-after.
func settle(t *testing.T, rs *Replica) int {
	t.Helper()
	live, err := rs.members(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rs.mu.Lock()
	rs.changedAt = time.Now().Add(-time.Hour)
	rs.mu.Unlock()
	return live
}

func wantDecision(t *testing.T, rs *Replica, won bool, err error, wantWon bool, want string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if st := rs.Status(); won != wantWon || st.Decision != want {
		t.Errorf("%s: won %v, decision %s (%s); want won %v, %s", st.ID, won, st.Decision, st.Why, wantWon, want)
	}
}

// A sleeping replica whose group has a live member that keeps up (its
// oldest unprocessed record is younger than --scale-up-after) stays
// asleep; one whose live member does not keep up wakes, and another
// sleeping replica then waits for it instead of waking too. The age is
// the time the replica saw the records wait: records stamped a year ago
// (a replay) are not a year-old backlog.
func TestReplicaScaleUp(t *testing.T) {
	r := newReplicaRig(t)
	for _, c := range []struct {
		stamped time.Duration // how old the records' timestamps are
		wake    bool
		decide  string
	}{
		{time.Second, false, DecisionKeptAsleep},
		{365 * 24 * time.Hour, false, DecisionKeptAsleep},
		{time.Minute, true, DecisionScaledUp},
	} {
		t.Run(fmt.Sprint(c.stamped), func(t *testing.T) {
			group := "g-" + c.stamped.String()
			r.member(group)
			r.scaleUp = 10 * time.Second
			if c.wake {
				r.scaleUp = 500 * time.Millisecond
			}
			a, b := r.replica(group, "a"), r.replica(group, "b")
			r.produce(3, time.Now().Add(-c.stamped))
			live := settle(t, a)
			if live != 1 {
				t.Fatalf("%d live members, want 1", live)
			}
			won, err := a.scaleUp(t.Context(), live)
			if c.wake {
				// Seen waiting longer than --scale-up-after: it wakes.
				deadline := time.Now().Add(15 * time.Second)
				for !won && err == nil && time.Now().Before(deadline) {
					won, err = a.scaleUp(t.Context(), live)
				}
			}
			wantDecision(t, a, won, err, c.wake, c.decide)
			st := a.Status()
			if st.Lag != 6 || (c.wake && st.OldestAgeMS < float64(r.scaleUp.Milliseconds())) || (!c.wake && st.OldestAgeMS > 5000) {
				t.Errorf("status %+v: want lag 6, oldest past --scale-up-after %v if woken, else young", st, r.scaleUp)
			}
			if !c.wake {
				return
			}
			settle(t, b)
			if err := b.claims.ReadTo(t.Context(), lastClaim(t, a)); err != nil {
				t.Fatal(err)
			}
			won, err = b.scaleUp(t.Context(), live)
			wantDecision(t, b, won, err, false, DecisionWaitingForOther)
		})
	}
}

func lastClaim(t *testing.T, rs *Replica) int64 {
	t.Helper()
	c, ok := rs.claims.Last()
	if !ok {
		t.Fatal("no valid claim")
	}
	return c.Offset
}

// In a group without live members, the first records wake one replica: it
// claims and wins; another replica that sees its claim stays asleep until
// the winner sleeps again, and then the next records wake it.
func TestReplicaFromZero(t *testing.T) {
	r := newReplicaRig(t)
	a, b := r.replica("h", "a"), r.replica("h", "b")
	r.produce(1, time.Now())
	won, err := a.fromZero(t.Context(), 0)
	wantDecision(t, a, won, err, true, DecisionWokenByLag)
	if err := b.claims.ReadTo(t.Context(), lastClaim(t, a)); err != nil {
		t.Fatal(err)
	}
	won, err = b.fromZero(t.Context(), 0)
	wantDecision(t, b, won, err, false, DecisionWaitingForOther)
	// a processed nothing (no member committed), slept again: b wakes.
	if err := a.claims.Asleep(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, last := a.claims.Pending(time.Now(), 0, claimBound)
	if err := b.claims.ReadTo(t.Context(), last); err != nil {
		t.Fatal(err)
	}
	won, err = b.fromZero(t.Context(), 0)
	wantDecision(t, b, won, err, true, DecisionWokenByLag)
}

// The replicas' claims reach a broker that speaks TLS and SCRAM only with
// the same options as the lag watch and the hold: the wake opens, and its
// claim wins.
func TestReplicasOverTLSAndSCRAM(t *testing.T) {
	addrs, _, ca := kafkatest.SecureCluster(t)
	o := testConfig(t, addrs)
	o.Group, o.Topics, o.Replicas = "g", []string{"t"}, true
	o.Kafka = Security{TLSCA: ca, SASLMechanism: "scram-sha-512", SASLUser: "kcr", SASLPassword: "s3cret"}
	w, err := Open(t.Context(), o)
	if err != nil {
		t.Fatalf("the Kafka wake of --replicas on TLS and SCRAM: %v", err)
	}
	defer w.Hold.Close()
	defer w.Source.Close()
	_, prev := w.Replica.claims.Pending(time.Now(), 0, claimBound)
	if won, err := w.Replica.claims.Claim(t.Context(), prev, 0, 1, "test"); err != nil || !won {
		t.Errorf("claim over TLS and SCRAM: won %v, err %v", won, err)
	}
}

// Two starts of a replica with the same host and image directory (two
// hostNetwork pods of one node) get different names, which readers count.
func TestReplicaIDUnique(t *testing.T) {
	a, err := replicaID("/var/lib/kcr/orders")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := replicaID("/var/lib/kcr/orders")
	if a == b {
		t.Errorf("two starts named %q", a)
	}
	odd, _ := replicaID("/var/lib/kcr/\x1b[2J\n" + strings.Repeat("x", 300))
	if strings.ContainsAny(odd, "\x1b\n") || len(odd) > 200 {
		t.Errorf("a replica name with control characters or too long: %q", odd)
	}
}

// A replica's key file: 16 bytes at least, read under the owner rule.
func TestReplicasKeyFile(t *testing.T) {
	dir := t.TempDir()
	short, good := filepath.Join(dir, "short"), filepath.Join(dir, "good")
	os.WriteFile(short, []byte("tiny\n"), 0o600)
	os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600)
	if _, err := readReplicasKey(short); err == nil || !strings.Contains(err.Error(), "16 at least") {
		t.Errorf("a 4-byte key: err %v, want it refused", err)
	}
	if k, err := readReplicasKey(good); err != nil || string(k) != "0123456789abcdef0123" {
		t.Errorf("a good key: %q, %v", k, err)
	}
}

// waitNoPending waits until rs sees no pending claim of the group (none
// from live members 0), within a bound well below claimBound.
func waitNoPending(t *testing.T, rs *Replica, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pending, _ := rs.claims.Pending(time.Now(), 0, claimBound)
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: replica %s still waits for the claim of %s (claimBound %v)", what, rs.Status().ID, pending[0].Replica, claimBound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A replica that won a claim and whose kcr standby stops releases it at
// once: another replica wakes for the work without waiting claimBound.
func TestReplicaStopReleasesClaim(t *testing.T) {
	r := newReplicaRig(t)
	a, b := r.replica("h", "a"), r.replica("h", "b")
	r.produce(1, time.Now())
	won, err := a.fromZero(t.Context(), 0)
	wantDecision(t, a, won, err, true, DecisionWokenByLag)
	if err := b.claims.ReadTo(t.Context(), lastClaim(t, a)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	waitNoPending(t, b, "a's kcr standby stopped")
	won, err = b.fromZero(t.Context(), 0)
	wantDecision(t, b, won, err, true, DecisionWokenByLag)
}

// A replica whose service died (here while a claim it won is pending, as
// during its restore) releases the claim at once.
func TestReplicaGoneReleasesClaim(t *testing.T) {
	r := newReplicaRig(t)
	a, b := r.replica("h", "a"), r.replica("h", "b")
	_, prev := a.claims.Pending(time.Now(), 0, claimBound)
	if won, err := a.claims.Claim(t.Context(), prev, 0, 1, "test"); err != nil || !won {
		t.Fatalf("a's claim: won %v, %v", won, err)
	}
	if err := b.claims.ReadTo(t.Context(), lastClaim(t, a)); err != nil {
		t.Fatal(err)
	}
	if pending, _ := b.claims.Pending(time.Now(), 0, claimBound); len(pending) != 1 {
		t.Fatalf("b sees %d pending claims, want 1", len(pending))
	}
	a.Gone("the service exited")
	waitNoPending(t, b, "a's service died")
}
