package kafkawake

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

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
		c, err := OpenClaims(t.Context(), addrs, "claims", group, self, "test", nil)
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
