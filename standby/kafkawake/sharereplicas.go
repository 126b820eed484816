package kafkawake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Backlog reads the share group's backlog on the watched topics (Pending)
// and the age of its oldest unacknowledged record: the record at a
// partition's share-partition start offset, dated by when this watcher
// first saw the partition's log end past it (one DescribeShareGroupOffsets
// to the coordinator, one ListOffsets per partition leader when there is a
// backlog). Its own clock, never a producer's timestamp: a watcher that
// has just started sees the records already waiting as arriving now. A
// group with no offsets on its topics has no backlog.
func (w *ShareWatcher) Backlog(ctx context.Context) (Backlog, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	parts, err := w.read(ctx, false)
	if errors.Is(err, ErrNoShareOffsets) {
		err = nil
	}
	if err != nil {
		return Backlog{}, err
	}
	var ask []string
	for _, pt := range parts {
		if pt.records > 0 && (len(ask) == 0 || ask[len(ask)-1] != pt.topic) {
			ask = append(ask, pt.topic) // parts come topic by topic
		}
	}
	var ends kadm.ListedOffsets
	if len(ask) > 0 {
		if ends, err = kadm.NewClient(w.cl).ListEndOffsets(ctx, ask...); err != nil {
			return Backlog{}, fmt.Errorf("share group %s: end offsets of %v: %w", w.cfg.Group, ask, err)
		}
	}
	var b Backlog
	now := time.Now()
	w.arr.mu.Lock()
	defer w.arr.mu.Unlock()
	w.arr.seenNow = map[string]bool{}
	for _, pt := range parts {
		lo, ok := ends.Lookup(pt.topic, pt.p)
		if pt.records <= 0 || !ok || lo.Err != nil || lo.Offset <= pt.from {
			continue
		}
		b.Records += pt.records
		if t := w.arr.since(partKey(pt.topic, pt.p), pt.from, lo.Offset, now); b.Oldest.IsZero() || t.Before(b.Oldest) {
			b.Oldest = t
		}
	}
	w.arr.forget()
	return b, nil
}

// Members counts the share group's members, leaving out those whose client
// id ignore names: the replicas that run now, and any other consumer of the
// group. stable is false while a member has no partition assigned yet (it
// has just joined, and fetches nothing).
func (w *ShareWatcher) Members(ctx context.Context, ignore func(clientID string) bool) (n int, stable bool, err error) {
	ds, err := kadm.NewClient(w.cl).DescribeShareGroups(ctx, w.cfg.Group)
	if err != nil {
		return 0, false, fmt.Errorf("describe share group %q: %w", w.cfg.Group, err)
	}
	d, ok := ds[w.cfg.Group]
	switch {
	case !ok, errors.Is(d.Err, kerr.GroupIDNotFound):
		return 0, true, nil
	case d.Err != nil:
		return 0, false, fmt.Errorf("describe share group %q: %w", w.cfg.Group, d.Err)
	}
	stable = true
	for _, m := range d.Members {
		if ignore != nil && ignore(m.ClientID) {
			continue
		}
		n++
		stable = stable && len(m.Assignment) > 0
	}
	return n, stable, nil
}
