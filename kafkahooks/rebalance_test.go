package kafkahooks

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/notify"
)

// slowApp is a pipeline-like consumer: it takes a batch (one record waited
// for, then whatever else comes within a millisecond), spends cost on each
// record, then commits the batch; it counts each (partition, offset) it
// processed in seen, shared by the group's members.
type slowApp struct {
	mu   sync.Mutex
	seen map[[2]int64]int
	by   map[*Reader]int
}

func (a *slowApp) run(ctx context.Context, r *Reader, batch int, cost time.Duration) {
	for ctx.Err() == nil {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return
		}
		msgs := []kafka.Message{m}
		for len(msgs) < batch {
			qctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			m, err := r.FetchMessage(qctx)
			cancel()
			if err != nil {
				break
			}
			msgs = append(msgs, m)
		}
		time.Sleep(time.Duration(len(msgs)) * cost)
		a.mu.Lock()
		for _, m := range msgs {
			a.seen[[2]int64{int64(m.Partition), m.Offset}]++
		}
		a.by[r] += len(msgs)
		a.mu.Unlock()
		// A batch taken is finished and committed, also when the
		// member is stopping.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for cctx.Err() == nil && r.CommitMessages(cctx, msgs...) != nil {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}
}

// counts returns how many distinct records were processed, and how many
// times records were processed again.
func (a *slowApp) counts() (distinct, again int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.seen {
		distinct++
		again += n - 1
	}
	return distinct, again
}

// TestRebalanceCommitsRecordsInHand: when a member joins the group and later
// leaves it, a member busy with a batch commits that batch through the
// generation it was handed in, and hands out nothing of that generation
// after it ends, so that no record is processed twice. kafka-go alone
// commits such a batch through the next generation, after the new owner
// read the older committed offset, and hands out its prefetched records of
// the old generation during the rejoin.
func TestRebalanceCommitsRecordsInHand(t *testing.T) {
	const n = 600
	k, _, _, log, _ := groupRig(t, 4, "orders", n)
	newReader := func(id string) *Reader {
		return NewReader(kafka.ReaderConfig{
			Brokers: k.addrs, GroupID: "g", Topic: "orders", StartOffset: kafka.FirstOffset,
			MaxWait: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second,
			JoinGroupBackoff: 100 * time.Millisecond, ReadBackoffMin: 10 * time.Millisecond, ReadBackoffMax: 100 * time.Millisecond,
		}, WithRegistry(notify.NewRegistry()), WithLogger(log), WithClientID(id), WithCommitWait(3*time.Second))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	app := &slowApp{seen: map[[2]int64]int{}, by: map[*Reader]int{}}
	start := func(r *Reader, ctx context.Context) *sync.WaitGroup {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); app.run(ctx, r, 10, 5*time.Millisecond) }()
		return &wg
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if ctx.Err() != nil {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	processed := func(m int) func() bool {
		return func() bool { d, _ := app.counts(); return d >= m }
	}

	a := newReader("a")
	defer a.Close()
	aDone := start(a, ctx)
	waitFor("a's first records", processed(50))

	// Scale up: b joins while a is busy.
	b := newReader("b")
	bctx, bstop := context.WithCancel(ctx)
	bDone := start(b, bctx)
	waitFor("b's first records", func() bool {
		app.mu.Lock()
		defer app.mu.Unlock()
		return app.by[b] > 0
	})
	d, _ := app.counts()
	waitFor("more records after the scale-up", processed(d+100))

	// Scale down: b stops after its batch and leaves.
	bstop()
	bDone.Wait()
	b.Close()
	waitFor("every record", processed(n))
	cancel()
	aDone.Wait()
	if _, again := app.counts(); again != 0 {
		t.Fatalf("%d records were processed twice across a scale-up and a scale-down", again)
	}
	// a's generation ended at least twice (b joined, b left).
	if h := a.holds.Load(); h < 2 {
		t.Fatalf("a held %d rebalances, want 2 at least", h)
	}
}
