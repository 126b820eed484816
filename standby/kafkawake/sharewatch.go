package kafkawake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultSharePoll is how often a ShareWatcher reads the share group's
// backlog while it waits: DescribeShareGroupOffsets has no long poll.
const DefaultSharePoll = 250 * time.Millisecond

// ShareConfig configures a ShareWatcher. Zero values take the documented
// defaults.
type ShareConfig struct {
	// Brokers are the bootstrap brokers (required).
	Brokers []string
	// Group is the service's share group (required).
	Group string
	// Topics, if set, are the only topics whose backlog counts (default:
	// every topic the share group has offsets for).
	Topics []string
	// Poll is how often Wait reads the backlog (default DefaultSharePoll):
	// one DescribeShareGroupOffsets request to the group's coordinator
	// each time.
	Poll time.Duration
	// BrokerTimeout bounds the broker check of NewShare (default 5 s).
	BrokerTimeout time.Duration
	// Logger receives the watcher's records (default slog.Default()).
	Logger *slog.Logger
	// Requests, if set, is told how many requests were written to brokers
	// since it was last told: every second while Wait runs, and when it
	// returns.
	Requests func(n int)
	// Opts are added to the watcher's own kgo options (TLS, SASL).
	Opts []kgo.Opt
}

// ShareWatcher watches one share group's backlog (ShareBacklog): records
// no member has acknowledged yet. A share group needs no base offsets nor
// state across restarts: the broker keeps the share-partition state.
type ShareWatcher struct {
	cfg  ShareConfig
	log  *slog.Logger
	cl   *kgo.Client
	reqs atomic.Int64
	// earliest: the group's share.auto.offset.reset is earliest, so the
	// broker hands out every record of a partition where the group has
	// acknowledged nothing (read at NewShare).
	earliest bool
	// state is read and written by Pending and Backlog, which callers do
	// not run with Wait, State or SetState.
	state ShareState
	// arr: when the oldest unacknowledged records were first seen
	// (Backlog).
	arr arrivals
}

// NewShare connects to the brokers and checks that they answer.
func NewShare(ctx context.Context, cfg ShareConfig) (*ShareWatcher, error) {
	if len(cfg.Brokers) == 0 || cfg.Group == "" {
		return nil, fmt.Errorf("%w: brokers and a share group are required", ErrConfig)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultSharePoll
	}
	if cfg.BrokerTimeout <= 0 {
		cfg.BrokerTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &ShareWatcher{cfg: cfg, log: cfg.Logger}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID("kcr-standby"),
		kgo.WithHooks(RequestCounter{&w.reqs}),
		// As the consumer-group watcher: a broker that is down or hangs
		// fails a reading fast, and the next one asks again.
		kgo.RequestRetries(0), kgo.RetryTimeout(time.Second), kgo.DialTimeout(time.Second),
		kgo.RequestTimeoutOverhead(2 * time.Second)}, cfg.Opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrConfig, cfg.Brokers, err)
	}
	w.cl = cl
	pctx, cancel := context.WithTimeout(ctx, cfg.BrokerTimeout)
	defer cancel()
	if _, err := ShareBacklog(pctx, cl, cfg.Group); err != nil {
		cl.Close()
		return nil, fmt.Errorf("--share-group %s: the backlog could not be read within %v (%v): start the broker (Kafka 4.2+, share groups on) or fix --brokers", cfg.Group, cfg.BrokerTimeout, err)
	}
	reset, err := shareReset(pctx, cl, cfg.Group)
	w.earliest = reset == "earliest"
	if !w.earliest {
		w.log.Warn("standby: kafka wake: the share group does not start at the earliest offset",
			"share_group", cfg.Group, "share.auto.offset.reset", reset, "err", err,
			"why", "records that land while the service sleeps, in a partition where the group has acknowledged nothing, may be skipped by the broker",
			"fix", "set share.auto.offset.reset=earliest on the group")
	}
	return w, nil
}

// Close closes the watcher's connections.
func (w *ShareWatcher) Close() { w.cl.Close() }

// ErrNoShareOffsets: the share group has no offsets on the watched topics
// (no member has fetched from them yet), so records landing there are not
// its backlog.
var ErrNoShareOffsets = errors.New("the share group has no offsets on its topics yet (no member has fetched from them)")

// Pending returns the share group's backlog on the watched topics, and the
// topics with some. It fails with ErrNoShareOffsets when the group has no
// offsets on any watched topic (on one of Topics, when given).
//
// A partition where the group has not acknowledged a record yet has no lag
// at the broker: there, the records past the end offset the watcher first
// saw count (ShareState).
//
// Unless the group's share.auto.offset.reset is earliest, the broker may
// skip those records when it loads the partition again (after the service
// slept): they wake the service but do not keep it awake, and Pending
// takes the partition's end offset as its new base.
func (w *ShareWatcher) Pending(ctx context.Context) (int64, []string, error) {
	return w.pending(ctx, !w.earliest)
}

// pending is Pending; settle moves the base of every partition where the
// group has acknowledged nothing to its end offset, and counts none there.
func (w *ShareWatcher) pending(ctx context.Context, settle bool) (int64, []string, error) {
	parts, err := w.read(ctx, settle)
	if err != nil {
		return 0, nil, err
	}
	var n int64
	var with []string
	for _, pt := range parts {
		if pt.records > 0 {
			n += pt.records
			if !slices.Contains(with, pt.topic) {
				with = append(with, pt.topic)
			}
		}
	}
	return n, with, nil
}

// sharePart is one watched share partition at a reading.
type sharePart struct {
	topic string
	p     int32
	// from is its oldest unacknowledged record: the share-partition start
	// offset, or the base where the group has acknowledged nothing.
	from int64
	// records are those counted in the backlog: the lag, or the records
	// past the base.
	records int64
}

// read reads the watched partitions of the share group, topic by topic in
// order; settle as pending.
func (w *ShareWatcher) read(ctx context.Context, settle bool) ([]sharePart, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := describeShare(ctx, w.cl, w.cfg.Group)
	if err != nil {
		return nil, err
	}
	topics := w.cfg.Topics
	if len(topics) == 0 {
		topics = slices.Sorted(maps.Keys(d.lags))
		for t := range d.unknown {
			if d.lags[t] == nil {
				topics = append(topics, t)
			}
		}
		slices.Sort(topics)
	}
	if len(topics) == 0 {
		return nil, ErrNoShareOffsets
	}
	fresh, err := w.unacknowledged(ctx, topics, d.unknown, settle)
	if err != nil {
		return nil, err
	}
	var parts []sharePart
	for _, t := range topics {
		if len(d.lags[t]) == 0 && len(d.unknown[t]) == 0 {
			return nil, fmt.Errorf("%w: topic %s", ErrNoShareOffsets, t)
		}
		for _, p := range slices.Sorted(maps.Keys(d.lags[t])) {
			parts = append(parts, sharePart{t, p, d.starts[t][p], d.lags[t][p]})
		}
		parts = append(parts, fresh[t]...)
	}
	return parts, nil
}

// unacknowledged returns, per topic, the unknown partitions of topics with
// the records past each one's base (their end offsets: one ListOffsets
// request per leader, only when there are some). A partition seen for the
// first time gets its end offset as base; one no longer unknown loses it.
func (w *ShareWatcher) unacknowledged(ctx context.Context, topics []string, unknown map[string][]int32, settle bool) (map[string][]sharePart, error) {
	out := map[string][]sharePart{}
	var ask []string
	for _, t := range topics {
		if len(unknown[t]) > 0 {
			ask = append(ask, t)
		}
	}
	var ends kadm.ListedOffsets
	if len(ask) > 0 {
		var err error
		if ends, err = kadm.NewClient(w.cl).ListEndOffsets(ctx, ask...); err != nil {
			return nil, fmt.Errorf("share group %s: end offsets of %v: %w", w.cfg.Group, ask, err)
		}
	}
	base := map[string]map[int32]int64{}
	for _, t := range ask {
		base[t] = map[int32]int64{}
		for _, p := range unknown[t] {
			lo, ok := ends.Lookup(t, p)
			if !ok || lo.Err != nil {
				return nil, fmt.Errorf("share group %s: end offset of %s/%d: %v", w.cfg.Group, t, p, lo.Err)
			}
			b, seen := w.state.Base[t][p]
			if !seen || settle {
				b = lo.Offset
			}
			base[t][p] = b
			out[t] = append(out[t], sharePart{t, p, b, max(0, lo.Offset-b)})
		}
	}
	w.state.Base = base
	return out, nil
}

// ShareState is what a ShareWatcher keeps across restarts of its process.
type ShareState struct {
	// Base is, per topic and partition where the group has acknowledged
	// nothing yet, the end offset when the watcher first saw it.
	Base map[string]map[int32]int64 `json:"base,omitempty"`
}

// State returns a copy of the watcher's state.
func (w *ShareWatcher) State() ShareState { return ShareState{Base: cloneBase(w.state.Base)} }

// SetState replaces the watcher's state by a copy of s.
func (w *ShareWatcher) SetState(s ShareState) { w.state = ShareState{Base: cloneBase(s.Base)} }

func cloneBase(b map[string]map[int32]int64) map[string]map[int32]int64 {
	c := make(map[string]map[int32]int64, len(b))
	for t, ps := range b {
		c[t] = maps.Clone(ps)
	}
	return c
}

// Wait returns nil as soon as the share group has a backlog (see
// Pending), or ctx.Err() when ctx ends first. It reads the backlog every
// Poll. Errors never end it: they are logged once per outage.
func (w *ShareWatcher) Wait(ctx context.Context) error {
	stop := reportRequests(&w.reqs, w.cfg.Requests)
	defer stop()
	var out outage
	for {
		n, topics, err := w.pending(ctx, false)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			if out.rounds == 0 {
				out.since = time.Now()
				w.log.Warn("standby: kafka wake: reading the share group's backlog failed; watching on, no wake on errors", "share_group", w.cfg.Group, "err", err)
			}
			out.rounds++
			out.last = err
		default:
			if out.rounds > 0 {
				w.log.Info("standby: kafka wake: the brokers answer again", "share_group", w.cfg.Group,
					"failed_rounds", out.rounds, "failing_ms", msSince(out.since), "last_err", out.last)
			}
			out = outage{}
			if n > 0 {
				w.log.Info("standby: kafka work", "share_group", w.cfg.Group, "records", n, "topics", topics)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.cfg.Poll):
		}
	}
}

// Group is the watched share group.
func (w *ShareWatcher) Group() string { return w.cfg.Group }

// shareReset reads the share group's share.auto.offset.reset (Kafka's
// default, latest, when the broker does not say).
func shareReset(ctx context.Context, cl *kgo.Client, group string) (string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	res.ConfigNames = []string{"share.auto.offset.reset"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "latest", err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return "latest", err
		}
		for _, c := range r.Configs {
			if c.Name == "share.auto.offset.reset" && c.Value != nil {
				return *c.Value, nil
			}
		}
	}
	return "latest", nil
}
