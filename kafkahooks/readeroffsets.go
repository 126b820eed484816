package kafkahooks

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/conntrack"
)

// A checkpoint makes a group Reader leave its group. A group left empty
// loses its committed offsets after offsets.retention.minutes (7 days by
// default); a Reader restored after that would start again from
// StartOffset: re-read everything (FirstOffset) or skip the downtime's
// records (LastOffset). So the before-checkpoint hook records the group's
// committed offsets of the Reader's topics in the image, and the
// after-restore hook, before the Reader rejoins, commits again those the
// broker no longer has. An offset the broker still has is never changed,
// whatever its value.

// dialFunc returns the base Dialer's dial function.
func (r *Reader) dialFunc() func(context.Context, string, string) (net.Conn, error) {
	d := r.baseDialer
	if d.DialFunc != nil {
		return d.DialFunc
	}
	return (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
}

// client returns a kafka.Client that dials through dial with the base
// Dialer's TLS (unless dial does TLS itself) and SASL settings, and a
// function that releases it.
func (r *Reader) client(dial func(context.Context, string, string) (net.Conn, error), clientID string, dialTLS bool) (*kafka.Client, func()) {
	tr := &kafka.Transport{Dial: dial, ClientID: clientID, TLS: r.baseDialer.TLS, SASL: r.baseDialer.SASLMechanism}
	if dialTLS {
		tr.TLS = nil
	}
	return &kafka.Client{Addr: kafka.TCP(r.rcfg.Brokers...), Transport: tr}, tr.CloseIdleConnections
}

// topicSet returns the Reader's topics.
func (r *Reader) topicSet() map[string]bool {
	set := map[string]bool{}
	if r.rcfg.Topic != "" {
		set[r.rcfg.Topic] = true
	}
	for _, t := range r.rcfg.GroupTopics {
		set[t] = true
	}
	return set
}

// fetchCommitted returns the group's committed offsets of the Reader's
// topics (of the given partitions; all of them if topics is nil), with -1
// for a partition the broker has none for and offsetUnknown for one it
// answered with an error.
func (r *Reader) fetchCommitted(ctx context.Context, cl *kafka.Client, topics map[string][]int) (map[tpKey]int64, error) {
	res, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: r.rcfg.GroupID, Topics: topics})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, fmt.Errorf("fetching the committed offsets of group %q: %w", r.rcfg.GroupID, err)
	}
	want := r.topicSet()
	out := map[tpKey]int64{}
	for topic, parts := range res.Topics {
		if !want[topic] {
			continue
		}
		for _, p := range parts {
			off := max(p.CommittedOffset, -1)
			if p.Error != nil {
				off = offsetUnknown
			}
			out[tpKey{topic, p.Partition}] = off
		}
	}
	return out, nil
}

// offsetUnknown marks a partition whose committed offset the broker did
// not give.
const offsetUnknown = -2

// recordCommitted returns the group's committed offsets to keep in the
// image, fetched through dial (the closing generation's connections).
func (r *Reader) recordCommitted(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), clientID string) (map[tpKey]int64, error) {
	cl, release := r.client(dial, clientID, false)
	defer release()
	all, err := r.fetchCommitted(ctx, cl, nil)
	if err != nil {
		return nil, err
	}
	for k, off := range all {
		if off < 0 {
			delete(all, k)
		}
	}
	return all, nil
}

// restoreCommitted compares the recorded offsets with the broker's and
// commits again, as a simple (generation -1) commit, those the broker no
// longer has. The group must be empty for that commit to be accepted: it is
// run before the Reader rejoins. Clones restored at once all commit the same
// offsets; one that finds the group already joined by another gets an error
// in its report, and the other has committed them.
func (r *Reader) restoreCommitted(ctx context.Context, recorded map[tpKey]int64, clientID string) *GroupRestore {
	gr := &GroupRestore{OffsetsChecked: len(recorded)}
	conns := conntrack.New(r.dialFunc(), nil)
	defer conns.CloseAll(true)
	cl, release := r.client(conns.DialContext, clientID, false)
	defer release()
	topics := map[string][]int{}
	for k := range recorded {
		topics[k.topic] = append(topics[k.topic], k.partition)
	}
	have, err := r.fetchCommitted(ctx, cl, topics)
	if err != nil {
		gr.OffsetsCheckError = err.Error()
		return gr
	}
	commit := map[string][]kafka.OffsetCommit{}
	for k, off := range recorded {
		if cur, ok := have[k]; ok && cur != -1 {
			continue // the broker has it (or did not say): leave it
		}
		gr.OffsetsRestored = append(gr.OffsetsRestored, PartitionOffset{Topic: k.topic, Partition: k.partition, Offset: off})
		commit[k.topic] = append(commit[k.topic], kafka.OffsetCommit{Partition: k.partition, Offset: off})
	}
	if len(commit) == 0 {
		return gr
	}
	slices.SortFunc(gr.OffsetsRestored, func(a, b PartitionOffset) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	res, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: r.rcfg.GroupID, GenerationID: -1, Topics: commit})
	if err == nil {
		var errs []error
		for topic, parts := range res.Topics {
			for _, p := range parts {
				if p.Error != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", topic, p.Partition, p.Error))
				}
			}
		}
		err = errors.Join(errs...)
	}
	if err != nil {
		gr.OffsetsCheckError = fmt.Sprintf("committing the recorded offsets of group %q again: %v", r.rcfg.GroupID, err)
	}
	return gr
}
