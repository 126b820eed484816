package kafkawake

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Members counts the group's live members, KIP-848 or classic, leaving out
// those whose client id ignore names (kcr standby's placeholders): the
// replicas that run now. stable is false while the group rebalances: a
// member that joined has no partitions yet.
func (w *Watcher) Members(ctx context.Context, ignore func(clientID string) bool) (n int, stable bool, err error) {
	cg, err := w.adm.DescribeConsumerGroups(ctx, w.cfg.Group)
	if d, ok := cg[w.cfg.Group]; err == nil && ok && d.Err == nil && d.State != "" && d.State != "Dead" {
		for _, m := range d.Members {
			if !ignore(m.ClientID) {
				n++
			}
		}
		return n, d.State == "Stable" || d.State == "Empty", nil
	}
	// Not a KIP-848 group: a classic one, or none.
	ds, err := w.adm.DescribeGroups(ctx, w.cfg.Group)
	if err != nil {
		return 0, false, fmt.Errorf("describe group %q: %w", w.cfg.Group, err)
	}
	d := ds[w.cfg.Group]
	switch {
	case errors.Is(d.Err, kerr.GroupIDNotFound):
		return 0, true, nil
	case d.Err != nil:
		return 0, false, fmt.Errorf("describe group %q: %w", w.cfg.Group, d.Err)
	}
	for _, m := range d.Members {
		if !ignore(m.ClientID) {
			n++
		}
	}
	return n, d.State == "Stable" || d.State == "Empty" || d.State == "Dead", nil
}
