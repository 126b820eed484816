package kafkawake

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// Replicas that claim a wake at the same moment, on the same reading of
// the log, settle with one winner, and every reader (a replica that opens
// the log later too) agrees on it. A claim made on a stale reading loses.
// The winner's claim is pending until the group has the members it
// wanted, its replica sleeps again, or it is older than the bound.
func TestClaimsOneWinner(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	openGroup := func(group, self string) *Claims {
		c, err := OpenClaims(t.Context(), ClaimsConfig{Brokers: addrs, Topic: "claims", Group: group, Self: self, Version: "test"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	open := func(self string) *Claims { return openGroup("g", self) }
	a, b := open("a"), open("b")
	// Another group's records, written in between, do not count.
	openGroup("h", "other-group-replica")
	// Both have read each other's hello.
	_, pa := a.Pending(time.Now(), 0, time.Minute)
	if err := b.ReadTo(t.Context(), pa); err != nil {
		t.Fatal(err)
	}
	_, pb := b.Pending(time.Now(), 0, time.Minute)
	if pa != pb {
		t.Fatalf("a read up to %d, b up to %d: want the same reading", pa, pb)
	}
	var wg sync.WaitGroup
	won := make([]bool, 2)
	for i, c := range []*Claims{a, b} {
		wg.Go(func() {
			ok, err := c.Claim(t.Context(), pa, 0, 1, "work waits")
			if err != nil {
				t.Error(err)
			}
			won[i] = ok
		})
	}
	wg.Wait()
	if won[0] == won[1] {
		t.Fatalf("a won %v, b won %v: want exactly one winner", won[0], won[1])
	}
	late := open("late")
	la, _ := a.Last()
	lb, _ := b.Last()
	ll, _ := late.Last()
	// Each reader times a claim by its own reading; the rest agrees.
	lb.At, ll.At = la.At, la.At
	if la != lb || la != ll || (la.Replica == "a") != won[0] {
		t.Errorf("last valid claims differ: a %+v, b %+v, late %+v (a won %v)", la, lb, ll, won[0])
	}
	if p, _ := late.Pending(time.Now(), 0, time.Minute); len(p) != 1 {
		t.Errorf("pending with no member: %v, want the winner's claim", p)
	}
	if p, _ := late.Pending(time.Now(), 1, time.Minute); len(p) != 0 {
		t.Errorf("pending once the winner joined: %v, want none", p)
	}
	if p, _ := late.Pending(time.Now().Add(2*time.Minute), 0, time.Minute); len(p) != 0 {
		t.Errorf("pending past the bound: %v, want none", p)
	}
	// The winner goes back to sleep: its claim is spent, even if no
	// reader saw it a member.
	winner := a
	if won[1] {
		winner = b
	}
	if err := winner.Asleep(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, last := winner.Pending(time.Now(), 0, time.Minute)
	if err := late.ReadTo(t.Context(), last); err != nil {
		t.Fatal(err)
	}
	if p, _ := late.Pending(time.Now(), 0, time.Minute); len(p) != 0 {
		t.Errorf("pending once the winner sleeps again: %v, want none", p)
	}
	// The loser claims again on its stale reading: it loses again.
	loser := b
	if won[1] {
		loser = a
	}
	if ok, err := loser.Claim(t.Context(), pa, 0, 1, "stale"); err != nil || ok {
		t.Errorf("a claim on a stale reading: won %v, err %v; want lost", ok, err)
	}
}

// forger writes records of its choosing to the claims topic, as anyone
// who can write it can.
type forger struct {
	t  *testing.T
	cl *kgo.Client
}

func newForger(t *testing.T, addrs []string) *forger {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &forger{t, cl}
}

// write writes value keyed by group, stamped ts (zero: now), and returns
// its offset.
func (f *forger) write(group string, value any, ts time.Time) int64 {
	f.t.Helper()
	b, ok := value.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(value); err != nil {
			f.t.Fatal(err)
		}
	}
	r, err := f.cl.ProduceSync(f.t.Context(), &kgo.Record{Topic: "claims", Key: []byte(group), Value: b, Timestamp: ts}).First()
	if err != nil {
		f.t.Fatal(err)
	}
	return r.Offset
}

func openClaims(t *testing.T, addrs []string, group, self string, key []byte) *Claims {
	t.Helper()
	c, err := OpenClaims(t.Context(), ClaimsConfig{Brokers: addrs, Topic: "claims", Group: group, Self: self, Version: "test", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Junk keyed by the group (not JSON, an unknown kind, a control character
// in a name, a wanted count out of bounds, a huge value) written between
// a replica's reading and its claim does not make the claim lose, and
// wakes no waiting replica.
func TestClaimsJunkDoesNotCount(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	a := openClaims(t, addrs, "g", "a", nil)
	f := newForger(t, addrs)
	_, prev := a.Pending(time.Now(), 0, time.Minute)
	changed := a.Changed()
	var last int64
	for _, v := range []any{
		[]byte("not json"),
		claimRecord{V: 1, Kind: "vote", Replica: "x", Prev: prev},
		claimRecord{V: 1, Kind: "claim", Replica: "evil\x1b[2J", Prev: prev, Want: 1},
		claimRecord{V: 1, Kind: "claim", Replica: "x", Prev: prev, Live: 0, Want: 1 << 30},
		claimRecord{V: 1, Kind: "hello", Replica: strings.Repeat("x", 5000), Prev: -1},
	} {
		last = f.write("g", v, time.Time{})
	}
	if err := a.ReadTo(t.Context(), last); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
		t.Error("junk woke the replicas waiting for a change of the claims")
	default:
	}
	if ok, err := a.Claim(t.Context(), prev, 0, 1, "work waits"); err != nil || !ok {
		t.Errorf("a claim after junk: won %v, err %v; want won", ok, err)
	}
}

// Records of another group on the same topic wake no waiting replica of
// this one.
func TestClaimsOtherGroupsQuiet(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	a := openClaims(t, addrs, "g", "a", nil)
	other := openClaims(t, addrs, "h", "b", nil)
	changed := a.Changed()
	var last int64
	for range 20 {
		_, prev := other.Pending(time.Now(), 0, time.Minute)
		if _, err := other.Claim(t.Context(), prev, 0, 1, "other"); err != nil {
			t.Fatal(err)
		}
		last = prev
		if err := other.Asleep(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ReadTo(t.Context(), last+1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
		t.Error("another group's claims woke the replicas waiting for a change")
	default:
	}
}

// A claim's time is when it was read: one stamped an hour ahead is given
// up after the bound like any other, and one stamped 40 s behind (its
// writer's clock) is pending as long as any other.
func TestClaimsTimeIsTheReaders(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	a := openClaims(t, addrs, "g", "a", nil)
	f := newForger(t, addrs)
	for _, skew := range []time.Duration{time.Hour, -40 * time.Second} {
		_, prev := a.Pending(time.Now(), 0, time.Minute)
		off := f.write("g", claimRecord{V: 1, Kind: "claim", Replica: "x" + skew.String(), Prev: prev, Live: 0, Want: 1}, time.Now().Add(skew))
		if err := a.ReadTo(t.Context(), off); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if p, _ := a.Pending(now, 0, 30*time.Second); len(p) == 0 || p[len(p)-1].Offset != off {
			t.Errorf("stamped %v: pending now %v, want the claim", skew, p)
		}
		if p, _ := a.Pending(now.Add(31*time.Second), 0, 30*time.Second); len(p) != 0 {
			t.Errorf("stamped %v: pending past the bound %v, want none", skew, p)
		}
	}
}

// The claims kept are bounded, whatever their timestamps: a claim dated
// an hour ahead at their head does not stop the pruning.
func TestClaimsBoundedState(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	a := openClaims(t, addrs, "g", "a", nil)
	f := newForger(t, addrs)
	_, prev := a.Pending(time.Now(), 0, time.Minute)
	for i := range claimsMax + 100 {
		ts := time.Time{}
		if i == 0 {
			ts = time.Now().Add(time.Hour)
		}
		prev = f.write("g", claimRecord{V: 1, Kind: "claim", Replica: "x", Prev: prev, Want: 1}, ts)
	}
	if err := a.ReadTo(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	n := len(a.valid)
	a.mu.Unlock()
	if n > claimsMax {
		t.Errorf("%d valid claims kept, want %d at most", n, claimsMax)
	}
	if l, _ := a.Last(); l.Offset != prev {
		t.Errorf("last claim %+v, want the newest (offset %d)", l, prev)
	}
}

// With a key, records not signed with it count for nothing: a forged
// claim (right previous offset, right group) neither wins nor blocks,
// and a forged asleep does not spend the winner's claim. Signed claims
// elect as before.
func TestClaimsSigned(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	key := []byte("0123456789abcdef-shared")
	a, b := openClaims(t, addrs, "g", "a", key), openClaims(t, addrs, "g", "b", key)
	f := newForger(t, addrs)
	_, prev := b.Pending(time.Now(), 0, time.Minute)
	if err := a.ReadTo(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	off := f.write("g", claimRecord{V: 1, Kind: "claim", Replica: "forger", Prev: prev, Want: 1}, time.Time{})
	if err := a.ReadTo(t.Context(), off); err != nil {
		t.Fatal(err)
	}
	if p, _ := a.Pending(time.Now(), 0, time.Minute); len(p) != 0 {
		t.Errorf("an unsigned claim is pending: %v", p)
	}
	if ok, err := a.Claim(t.Context(), prev, 0, 1, "work waits"); err != nil || !ok {
		t.Fatalf("a signed claim after a forged one: won %v, err %v; want won", ok, err)
	}
	off = f.write("g", claimRecord{V: 1, Kind: "asleep", Replica: a.self, Prev: -1}, time.Time{})
	if err := b.ReadTo(t.Context(), off); err != nil {
		t.Fatal(err)
	}
	if p, _ := b.Pending(time.Now(), 0, time.Minute); len(p) != 1 || p[0].Replica != "a" {
		t.Errorf("pending after a forged asleep of the winner: %v, want a's claim", p)
	}
	// A replica with another key (or none) does not count a's records.
	c := openClaims(t, addrs, "g", "c", []byte("another key, 16 bytes+"))
	if p, _ := c.Pending(time.Now(), 0, time.Minute); len(p) != 0 {
		t.Errorf("a replica with another key counts %v", p)
	}
}

// replay writes again, as they are (headers included), the records of
// the claims topic up to off that match: what someone who can read and
// write the topic, but has no key, can do with signed records.
func (f *forger) replay(off int64, match func(claimRecord) bool) int64 {
	f.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.cl.OptValue(kgo.SeedBrokers).([]string)...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"claims": {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	ctx, cancel := context.WithTimeout(f.t.Context(), 30*time.Second)
	defer cancel()
	for done := false; !done; {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			f.t.Fatalf("reading the claims topic up to offset %d: %v", off, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			var cr claimRecord
			if r.Offset <= off && json.Unmarshal(r.Value, &cr) == nil && match(cr) {
				recs = append(recs, &kgo.Record{Topic: "claims", Key: r.Key, Value: r.Value, Headers: r.Headers})
			}
			done = done || r.Offset >= off
		})
	}
	var last int64 = -1
	for _, r := range recs {
		res, err := f.cl.ProduceSync(f.t.Context(), r).First()
		if err != nil {
			f.t.Fatal(err)
		}
		last = res.Offset
	}
	if last < 0 {
		f.t.Fatal("nothing to replay")
	}
	return last
}

// Signed records written again as they are (a replay, by someone who can
// read and write the topic without the key) count no more: a replayed
// claim or hello does not make a claim decided before it lose, and a
// replayed asleep of a replica does not spend the claim it won since.
func TestClaimsReplayed(t *testing.T) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "claims"))
	key := []byte("0123456789abcdef-shared")
	a, b := openClaims(t, addrs, "g", "a", key), openClaims(t, addrs, "g", "b", key)
	f := newForger(t, addrs)
	_, prev := b.Pending(time.Now(), 0, time.Minute)
	if err := a.ReadTo(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Claim(t.Context(), prev, 0, 1, "work waits"); err != nil || !ok {
		t.Fatalf("a's claim: won %v, err %v", ok, err)
	}
	if err := a.Asleep(t.Context()); err != nil {
		t.Fatal(err)
	}
	// b decides on its reading; replays land before its claim.
	_, prev = a.Pending(time.Now(), 0, time.Minute)
	if err := b.ReadTo(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	f.replay(prev, func(cr claimRecord) bool { return cr.Kind == "claim" || cr.Kind == "hello" })
	if ok, err := b.Claim(t.Context(), prev, 0, 1, "work waits"); err != nil || !ok {
		t.Fatalf("b's claim after replayed claims and hellos: won %v, err %v; want won", ok, err)
	}
	if err := b.Asleep(t.Context()); err != nil {
		t.Fatal(err)
	}
	// a wins again; its earlier asleep, replayed, does not spend that.
	_, prev = b.Pending(time.Now(), 0, time.Minute)
	if err := a.ReadTo(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Claim(t.Context(), prev, 0, 1, "work waits again"); err != nil || !ok {
		t.Fatalf("a's second claim: won %v, err %v", ok, err)
	}
	_, prev = a.Pending(time.Now(), 0, time.Minute)
	off := f.replay(prev, func(cr claimRecord) bool { return cr.Kind == "asleep" && cr.Replica == "a" })
	if err := b.ReadTo(t.Context(), off); err != nil {
		t.Fatal(err)
	}
	if p, _ := b.Pending(time.Now(), 0, time.Minute); len(p) != 1 || p[0].Replica != "a" || p[0].Reason != "work waits again" {
		t.Errorf("pending after a's asleep replayed: %v, want a's second claim", p)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.junk == 0 {
		t.Error("the replayed hellos were not counted as records that do not count")
	}
	a.mu.Unlock()
	// A hello first seen, signed, but written long before its broker
	// timestamp (replayed after the readers' reading window) counts for
	// no reader.
	old := claimRecord{V: claimsFormat, Kind: "hello", Replica: "replayed", Prev: -1, At: time.Now().Add(-2 * time.Hour).UnixMilli()}
	v, _ := json.Marshal(old)
	r, err := f.cl.ProduceSync(t.Context(), &kgo.Record{Topic: "claims", Key: []byte("g"), Value: v,
		Headers: []kgo.RecordHeader{{Key: macHeader, Value: a.mac(v)}}}).First()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ReadTo(t.Context(), r.Offset); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	if a.hellos["replayed"] || a.last == r.Offset {
		t.Errorf("a hello written 2 h before its broker timestamp counted")
	}
}
