package kgohooks

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// adjustFn is the signature of kgo.AdjustFetchOffsetsFn.
type adjustFn = func(context.Context, map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error)

// groupStarts is what one kgo client of a group member knows about where
// its partitions started. kgo resolves the start offset of a partition
// without a commit (ConsumeResetOffset: AtEnd, AtStart, …) on its own and
// keeps the result to itself; a checkpoint that leaves the group would lose
// it, and the restored member would resolve AtEnd again, past the records
// produced meanwhile. So kgohooks resolves those offsets itself, in kgo's
// AdjustFetchOffsetsFn, hands kgo the exact ones, and a checkpoint commits
// them (pins) for the partitions the group has no commit for.
type groupStarts struct {
	cl atomic.Pointer[kgo.Client] // set once kgo.NewClient returned

	mu   sync.Mutex
	pins map[tp]int64 // exact start offsets of partitions assigned without a commit
	// recorded holds the group's committed offsets at the last checkpoint
	// (with the pins), for a client built after it: a partition assigned
	// without a commit continues from there, once.
	recorded map[tp]int64
}

func newGroupStarts(recorded map[tp]int64) *groupStarts {
	return &groupStarts{pins: map[tp]int64{}, recorded: recorded}
}

func (g *groupStarts) snapshot() map[tp]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.pins)
}

// client waits until the kgo client is known (AdjustFetchOffsetsFn may run
// before kgo.NewClient returned to build).
func (g *groupStarts) client(ctx context.Context) (*kgo.Client, error) {
	for {
		if cl := g.cl.Load(); cl != nil {
			return cl, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// adjust is the kgo.AdjustFetchOffsetsFn of a group member's client: the
// user's own first, then every partition left with a symbolic offset (no
// commit) gets the offset the image recorded, if the group lost its commit
// (offsets.retention.minutes), or else an exact offset resolved now. Offsets
// kgo resolves in ways kgohooks does not (LookbackOffset, RewindOffset,
// AtCommitted) are left to kgo, and not pinned.
func (c *core) adjust(g *groupStarts, user adjustFn) adjustFn {
	return func(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
		if user != nil {
			var err error
			if offs, err = user(ctx, offs); err != nil {
				return offs, err
			}
		}
		want := map[tp]startOffset{}
		var restored []string
		g.mu.Lock()
		for t, ps := range offs {
			for p, o := range ps {
				at, sym, err := classify(o)
				if err != nil || at >= 0 {
					continue
				}
				k := tp{t, p}
				if r, ok := g.recorded[k]; ok {
					delete(g.recorded, k)
					ps[p] = kgo.NewOffset().At(r)
					g.pins[k] = r
					restored = append(restored, fmt.Sprintf("%s/%d@%d", t, p, r))
					continue
				}
				want[k] = sym
			}
		}
		g.mu.Unlock()
		if len(restored) > 0 {
			c.cfg.log.Warn("the group had no committed offset for partitions the checkpoint recorded (expired by offsets.retention.minutes while the group was empty, or deleted); continuing from the recorded offsets",
				"group", c.group, "partitions", restored)
			c.noteRecordedRestored(len(restored))
		}
		if len(want) == 0 {
			return offs, nil
		}
		cl, err := g.client(ctx)
		if err == nil {
			var exact map[tp]int64
			if exact, err = resolveStarts(ctx, kadm.NewClient(cl), c.readCommitted, want); err == nil {
				g.mu.Lock()
				for k, at := range exact {
					offs[k.topic][k.partition] = kgo.NewOffset().At(at)
					g.pins[k] = at
				}
				g.mu.Unlock()
				return offs, nil
			}
		}
		c.cfg.log.Warn("resolving the start offsets of partitions without a commit; kgo resolves them, and a checkpoint cannot pin them", "err", err)
		return offs, nil
	}
}

// noteRecordedRestored adds n to the after-restore report's count of
// partitions continued from recorded offsets.
func (c *core) noteRecordedRestored(n int) {
	c.repMu.Lock()
	defer c.repMu.Unlock()
	total := c.recordedRestored.Add(int64(n))
	if rep, ok := c.reports.Load(); ok && rep.Restore != nil {
		rs := *rep.Restore
		rs.RecordedOffsetsRestored = int(total)
		rep.Restore = &rs
		c.reports.Store(rep)
	}
}

// pinStarts commits, as the member, the exact start offsets of the
// partitions this client resolved and the group has no commit for (nothing
// was committed since they were assigned: nothing polled, or polled and not
// committed yet), so that the next member starts there and not at a new
// resolution of ConsumeResetOffset. It returns how many it pinned and the
// group's committed offsets afterwards, which the next client uses for the
// partitions the group has lost by then.
func (c *core) pinStarts(ctx context.Context, cl *kgo.Client, g *groupStarts) (int, map[tp]int64, error) {
	adm := kadm.NewClient(cl)
	var fetched kadm.OffsetResponses
	if _, err := c.retry(ctx, "fetch the group's committed offsets", func(ctx context.Context) error {
		var err error
		if fetched, err = adm.FetchOffsets(ctx, c.group); err == nil {
			err = fetched.Error()
		}
		return err
	}); err != nil {
		return 0, nil, err
	}
	committed := map[tp]int64{}
	fetched.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At >= 0 {
			committed[tp{o.Topic, o.Partition}] = o.At
		}
	})
	pins := g.snapshot()
	var unpinned []tp
	for k := range pins {
		if _, ok := committed[k]; !ok {
			unpinned = append(unpinned, k)
		}
	}
	n := len(unpinned)
	if n > 0 {
		pin := c.pinOffsets(ctx, adm, pins, unpinned)
		if _, err := c.retry(ctx, "commit the start offsets of partitions without a commit", func(ctx context.Context) error {
			var cerr error
			cl.CommitOffsetsSync(ctx, pin, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
				if cerr = err; cerr != nil || resp == nil {
					return
				}
				for _, t := range resp.Topics {
					for _, p := range t.Partitions {
						if cerr == nil {
							cerr = kerr.ErrorForCode(p.ErrorCode)
						}
					}
				}
			})
			return cerr
		}); err != nil {
			return 0, nil, err
		}
		for t, ps := range pin {
			for p, eo := range ps {
				committed[tp{t, p}] = eo.Offset
			}
		}
	}
	return n, committed, nil
}

// pinOffsets returns the offsets pinStarts commits for the partitions ks,
// each with its leader's current epoch. A commit with an epoch is validated
// by the next member (OffsetForLeaderEpoch) before it fetches; one without
// is fetched at once. kgo sends one fetch per broker at a time, so a member
// restored with both kinds long-polls the partitions without an epoch
// (kgo.FetchMaxWait, 5 s by default) while the others, whose records woke
// it, wait for that fetch to end. Commits of polled records carry their
// epoch, so the pins carry one too. Without metadata, they carry none.
func (c *core) pinOffsets(ctx context.Context, adm *kadm.Client, pins map[tp]int64, ks []tp) map[string]map[int32]kgo.EpochOffset {
	var topics []string
	for _, k := range ks {
		if !slices.Contains(topics, k.topic) {
			topics = append(topics, k.topic)
		}
	}
	md, err := adm.Metadata(ctx, topics...)
	if err != nil {
		c.cfg.log.Debug("leader epochs for the pinned start offsets", "err", err)
	}
	pin := map[string]map[int32]kgo.EpochOffset{}
	for _, k := range ks {
		eo := epochAt(pins[k])
		if pd, ok := md.Topics[k.topic].Partitions[k.partition]; ok && err == nil && pd.Err == nil {
			eo.Epoch = pd.LeaderEpoch
		}
		put(pin, k, eo)
	}
	return pin
}
