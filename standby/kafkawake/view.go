package kafkawake

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// view is one reading of the group: where the work of each partition
// starts, and which broker leads it.
type view struct {
	topics   []string
	names    map[kadm.TopicID]string
	byLeader map[int32][]*part
	// incomplete: a topic or a leader was missing; the next reading comes
	// sooner.
	incomplete bool
}

// part is one watched partition.
type part struct {
	topic string
	id    kadm.TopicID
	p     int32
	epoch int32 // the leader's epoch
	from  int64 // the next offset to fetch: records from here are work
	// base: from is the partition's base, not a committed offset (an
	// offset out of range then moves the base).
	base bool
}

// setup reads the group's commits, its topics' ids and leaders, and the
// base of every partition the group did not commit.
func (w *Watcher) setup(ctx context.Context) (*view, error) {
	committed, err := w.adm.FetchOffsets(ctx, w.cfg.Group)
	if err == nil {
		err = committed.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// Deleted, or expired with its offsets while empty: no commits.
		committed, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fetch the committed offsets of group %q: %w", w.cfg.Group, err)
	}
	topics := w.cfg.Topics
	if len(topics) == 0 {
		topics = committed.Partitions().Topics()
		// Topics whose commits vanished are still the service's: its
		// image recorded the offsets it goes on from.
		for t := range w.state.Base {
			if !slices.Contains(topics, t) {
				topics = append(topics, t)
			}
		}
		slices.Sort(topics)
	}
	if len(topics) == 0 {
		return nil, ErrNoTopics
	}
	meta, err := w.adm.Metadata(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("read the metadata of %v: %w", topics, err)
	}
	v := &view{topics: topics, names: map[kadm.TopicID]string{}, byLeader: map[int32][]*part{}}
	fresh := w.noteTopicIDs(meta.Topics)
	var need []*part // partitions without a commit or a base
	for _, t := range topics {
		td, ok := meta.Topics[t]
		if !ok || td.Err != nil {
			// Gone, or not created yet: watched again at the next
			// reading, which comes sooner.
			v.incomplete = true
			continue
		}
		v.names[td.ID] = t
		for _, pd := range td.Partitions.Sorted() {
			if pd.Err != nil || pd.Leader < 0 {
				v.incomplete = true
				continue
			}
			pt := &part{topic: t, id: td.ID, p: pd.Partition, epoch: pd.LeaderEpoch}
			pt.from, pt.base = w.startOf(committed, t, pd.Partition)
			if pt.from < 0 {
				need = append(need, pt)
			}
			v.byLeader[pd.Leader] = append(v.byLeader[pd.Leader], pt)
		}
	}
	if len(v.byLeader) == 0 {
		return nil, fmt.Errorf("no partition of %v has a leader (topics missing: %v)", topics, v.incomplete)
	}
	if err := w.baseOf(ctx, need, fresh); err != nil {
		return nil, err
	}
	return v, nil
}

// noteTopicIDs records the topics' ids and returns the topics whose id
// changed: created again, so every record of theirs is new. The base of
// such a topic is dropped.
func (w *Watcher) noteTopicIDs(td kadm.TopicDetails) map[string]bool {
	fresh := map[string]bool{}
	for t, d := range td {
		if d.Err != nil || d.ID == (kadm.TopicID{}) {
			continue
		}
		id := d.ID.String()
		if old, ok := w.state.TopicIDs[t]; ok && old != id {
			w.log.Info("standby: topic created again; all its records are new", "group", w.cfg.Group, "topic", t)
			delete(w.state.Base, t)
			fresh[t] = true
		}
		w.state.TopicIDs[t] = id
	}
	return fresh
}

// startOf is where the work of partition p of topic t starts: the group's
// commit (which becomes the base), else the base; -1 if neither is known.
func (w *Watcher) startOf(committed kadm.OffsetResponses, t string, p int32) (int64, bool) {
	if c, ok := committed.Lookup(t, p); ok && c.Err == nil && c.At >= 0 {
		w.setBase(t, p, c.At)
		return c.At, false
	}
	if b, ok := w.state.Base[t][p]; ok {
		return b, true
	}
	return -1, true
}

func (w *Watcher) setBase(t string, p int32, at int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state.Base[t] == nil {
		w.state.Base[t] = map[int32]int64{}
	}
	w.state.Base[t][p] = at
}

// baseOf sets the base of the partitions in need: their last stable offset
// (what a read_committed consumer that starts at the end starts from), or
// their log start for the topics created again.
func (w *Watcher) baseOf(ctx context.Context, need []*part, fresh map[string]bool) error {
	if len(need) == 0 {
		return nil
	}
	var ends, starts []string
	for _, pt := range need {
		if fresh[pt.topic] {
			starts = append(starts, pt.topic)
		} else {
			ends = append(ends, pt.topic)
		}
	}
	listed := kadm.ListedOffsets{}
	for _, l := range []struct {
		topics []string
		list   func(context.Context, ...string) (kadm.ListedOffsets, error)
	}{{ends, w.adm.ListCommittedOffsets}, {starts, w.adm.ListStartOffsets}} {
		if len(l.topics) == 0 {
			continue
		}
		got, err := l.list(ctx, slices.Compact(slices.Sorted(slices.Values(l.topics)))...)
		if err == nil {
			err = got.Error()
		}
		if err != nil {
			return fmt.Errorf("list the offsets of %v: %w", l.topics, err)
		}
		got.Each(func(o kadm.ListedOffset) {
			if listed[o.Topic] == nil {
				listed[o.Topic] = map[int32]kadm.ListedOffset{}
			}
			listed[o.Topic][o.Partition] = o
		})
	}
	for _, pt := range need {
		o, ok := listed.Lookup(pt.topic, pt.p)
		if !ok {
			return fmt.Errorf("list the offsets of %s/%d: no answer", pt.topic, pt.p)
		}
		pt.from = o.Offset
		w.setBase(pt.topic, pt.p, o.Offset)
	}
	return nil
}
