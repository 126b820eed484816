package kgohooks

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// Two members of a group; one is checkpointed. The other takes its
// partitions during the checkpoint (it left the group), no committed offset
// goes back, nothing is lost, and the restored member rejoins.
func TestTwoMembersOneCheckpointed(t *testing.T) {
	addrs := newCluster(t, 2, "two")
	producePlain(t, addrs, "two", vals("a", 40), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var mu sync.Mutex
	seen := map[string]int{}
	byMember := map[string]map[int32]bool{}
	count := func(prefix string) int {
		mu.Lock()
		defer mu.Unlock()
		return countPrefixed(seen, prefix)
	}
	member := func(name string, reg *notify.Registry) *Client {
		c, err := New(groupOpts(addrs, "two", "two", kgo.SessionTimeout(2*time.Second),
			kgo.HeartbeatInterval(100*time.Millisecond), kgo.ClientID(name)), WithRegistry(reg))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	run := func(name string, c *Client, phase *string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				fs := c.PollFetches(ctx)
				mu.Lock()
				fs.EachRecord(func(r *kgo.Record) {
					seen[string(r.Value)]++
					if byMember[name+*phase] == nil {
						byMember[name+*phase] = map[int32]bool{}
					}
					byMember[name+*phase][r.Partition] = true
				})
				mu.Unlock()
			}
		}()
	}

	regA, regB := notify.NewRegistry(), notify.NewRegistry()
	phase := ""
	var b *Client
	// Runs after A's before hook: A has left; B must consume both
	// partitions now.
	regA.Register("probe", notify.Func(func(context.Context) error {
		mu.Lock()
		phase = "-during"
		mu.Unlock()
		producePlain(t, addrs, "two", vals("d", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
		wait.Until(4*time.Second, func() bool { return count("d-") >= 10 })
		return nil
	}, nil))
	a := member("a", regA)
	defer a.Close()
	b = member("b", regB)
	defer b.Close()
	run("a", a, &phase)
	run("b", b, &phase)
	for count("a-") < 40 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}

	committed := func() map[int32]int64 {
		m := map[int32]int64{}
		fetchCommitted(t, ctx, addrs, "two").Each(func(o kadm.OffsetResponse) { m[o.Partition] = o.At })
		return m
	}
	hooktest.SimulateOK(t, ctx, regA, notify.SimRestore, 8*time.Second)
	if count("d-") < 10 {
		t.Errorf("only %d of 10 records produced during the checkpoint were consumed by the other member", count("d-"))
	}
	mu.Lock()
	if ps := byMember["b-during"]; len(ps) != 2 {
		t.Errorf("during the checkpoint member b consumed partitions %v, want both", ps)
	}
	phase = "-after"
	mu.Unlock()
	atCycle := committed()

	producePlain(t, addrs, "two", vals("z", 40), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	for count("z-") < 40 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if n := count("z-"); n != 40 {
		t.Errorf("%d of 40 records after the restore consumed", n)
	}
	// The restored member rejoins and gets partitions again.
	wait.Until(8*time.Second, func() bool {
		mu.Lock()
		n := len(byMember["a-after"])
		mu.Unlock()
		if n > 0 {
			return true
		}
		producePlain(t, addrs, "two", vals("y", 2), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
		time.Sleep(200 * time.Millisecond)
		return false
	})
	mu.Lock()
	if len(byMember["a-after"]) == 0 {
		t.Errorf("the restored member consumed nothing after rejoining")
	}
	mu.Unlock()
	if err := a.CommitUncommittedOffsets(ctx); err != nil {
		t.Logf("commit a: %v", err)
	}
	if err := b.CommitUncommittedOffsets(ctx); err != nil {
		t.Logf("commit b: %v", err)
	}
	end := committed()
	for p, o := range atCycle {
		if end[p] < o {
			t.Errorf("partition %d: committed offset went back from %d to %d", p, o, end[p])
		}
	}
}
