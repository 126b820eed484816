// Package kafkawake finds the Kafka work of a sleeping service: records its
// consumer group has not committed yet, and that a read_committed consumer
// would be handed.
//
// The Watcher reads the group's committed offsets and its topics' leaders,
// then fetches from those offsets, read_committed, one Fetch per partition
// leader. By default the Fetch long-polls (MinBytes 1): the broker answers
// when a record lands, and otherwise once every ten seconds. With Poll set it
// fetches every Poll instead, without waiting at the broker. Transaction
// markers and aborted batches are skipped, never counted: a transactional
// upstream leaves one marker past the last committed record of every
// transaction, and a consumer commits the offset just past its last record.
//
// A partition without a committed offset counts from its base: the last
// offset the group was seen to commit there, or, for a partition it never
// committed, its last stable offset when the watcher first saw it. So the
// records there before (which a consumer that starts at the end would never
// read) are no work, and every record after is, until the group commits the
// partition. When the group's offsets vanish while the service sleeps
// (deleted, or expired with the group empty), the service, whose hooks go on
// from the offsets its image recorded, is woken by the records past them,
// and its topics stay watched. A topic deleted and created again (a new
// topic id) counts from its log start: all its records are new.
//
// Broker errors (a broker down, a leader that moved, a topic gone) are
// logged once per outage and never wake the service: the watcher reads the
// leaders again and goes on.
//
// For replicas of one service (kcr standby --replicas), Members counts the
// group's live members, Backlog reads its lag and the age of its oldest
// unprocessed record, and Claims elects, through a topic, the one sleeping
// replica that wakes.
//
// ShareWatcher watches a share group (KIP-932) instead: its backlog, the
// records no member has acknowledged, read every Poll (DescribeShareGroupOffsets
// has no long poll).
package kafkawake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config configures a Watcher. Zero values take the documented defaults.
type Config struct {
	// Brokers are the bootstrap brokers (required).
	Brokers []string
	// Group is the service's consumer group (required).
	Group string
	// Topics are the topics whose records are work (default: those the
	// group committed, and those it committed before its offsets
	// vanished).
	Topics []string
	// Poll, if set, fetches every Poll without waiting at the broker;
	// zero long-polls: the broker answers a Fetch when a record lands.
	Poll time.Duration
	// BrokerTimeout bounds the broker check of New (default 5 s).
	BrokerTimeout time.Duration
	// Logger receives the watcher's records (default slog.Default()).
	Logger *slog.Logger
	// Requests, if set, is told how many requests were written to brokers
	// since it was last told: every second while Wait runs, and when it
	// returns.
	Requests func(n int)
	// Opts are added to the watcher's own kgo options: how to reach the
	// brokers (kgo.DialTLSConfig, kgo.SASL). None: PLAINTEXT.
	Opts []kgo.Opt
}

// State is what a Watcher keeps across restarts of its process: without
// it, a record that lands in a partition the group never committed, or past
// offsets that vanished, while no watcher runs would not be seen as work.
type State struct {
	// Base is, per topic and partition, the last offset the group was seen
	// to commit, or the last stable offset of a partition it never
	// committed when first seen.
	Base map[string]map[int32]int64 `json:"base,omitempty"`
	// TopicIDs are the ids (base64) of the topics in Base: a topic
	// created again has a new one.
	TopicIDs map[string]string `json:"topic_ids,omitempty"`
}

func (s State) clone() State {
	c := State{Base: make(map[string]map[int32]int64, len(s.Base)), TopicIDs: maps.Clone(s.TopicIDs)}
	for t, ps := range s.Base {
		c.Base[t] = maps.Clone(ps)
	}
	if c.TopicIDs == nil {
		c.TopicIDs = map[string]string{}
	}
	return c
}

// Timing of the watch.
const (
	// longWait is how long the broker holds a long-polling Fetch: one
	// request per leader every longWait while nothing arrives.
	longWait = 10 * time.Second
	// refreshEvery is how often a Wait reads the commits, topics and
	// leaders again (offsets reset by an admin, partitions added).
	refreshEvery = 30 * time.Second
	// retryMin and retryMax bound the wait after a failed round. A round
	// against a broker that is down costs a refused dial, so retrying every
	// second is cheap, and a longer wait only delays the wake after the
	// broker is back (by up to 5 s, when this was 5 s).
	retryMin = 200 * time.Millisecond
	retryMax = time.Second
	// incompleteEvery is how soon the group is read again when a topic or
	// a leader was missing from the last reading.
	incompleteEvery = 5 * time.Second
	// scanRounds bounds the fetches that skip markers and aborted batches
	// in one Pending.
	scanRounds = 100
	// partitionMaxBytes: enough to see that there is a record.
	partitionMaxBytes = 64 << 10
)

// Watcher watches one consumer group. Pending and Wait must not run at the
// same time.
type Watcher struct {
	cfg  Config
	log  *slog.Logger
	cl   *kgo.Client
	adm  *kadm.Client
	reqs atomic.Int64 // requests written to brokers

	// state is read and written by Pending and Wait, which callers do
	// not run at the same time, nor State and SetState with them; mu
	// guards the writes of a Wait's fetches, which run in parallel.
	mu    sync.Mutex
	state State
	arr   arrivals // Backlog's
}

// ErrConfig is wrapped by the errors of New that a Config causes.
var ErrConfig = errors.New("kafka wake")

// New connects to the brokers and checks that they answer.
func New(ctx context.Context, cfg Config) (*Watcher, error) {
	if len(cfg.Brokers) == 0 || cfg.Group == "" {
		return nil, fmt.Errorf("%w: brokers and a group are required", ErrConfig)
	}
	if cfg.BrokerTimeout <= 0 {
		cfg.BrokerTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Watcher{cfg: cfg, log: cfg.Logger, state: State{}.clone()}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID("kcr-standby"),
		kgo.WithHooks(RequestCounter{&w.reqs}),
		// A broker that is down must not hold a round long: the next
		// round asks again.
		kgo.RequestRetries(0), kgo.RetryTimeout(time.Second), kgo.DialTimeout(time.Second),
		// Nor one that hangs (paused, overloaded): a request fails 2 s
		// past its own wait instead of kgo's default 10 s.
		kgo.RequestTimeoutOverhead(2 * time.Second),
		// Every reading of the group asks for the leaders and topic ids
		// afresh (kadm answers from a cache that is younger).
		kgo.MetadataMinAge(10 * time.Millisecond),
		// The group is read every refreshEvery: its connections stay.
		kgo.ConnIdleTimeout(2 * refreshEvery)}, cfg.Opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrConfig, cfg.Brokers, err)
	}
	w.cl, w.adm = cl, kadm.NewClient(cl)
	if err := checkBrokers(ctx, w.adm, cfg.BrokerTimeout); err != nil {
		cl.Close()
		return nil, fmt.Errorf("--brokers %v: no broker answered within %v (%v): start the broker or fix --brokers", cfg.Brokers, cfg.BrokerTimeout, err)
	}
	return w, nil
}

// checkBrokers asks for the brokers until one answers or timeout ends: the
// client neither retries a request nor waits past a second for a dial (the
// rounds need that), and one slow TLS or SASL handshake on a loaded host
// must not fail the start.
func checkBrokers(ctx context.Context, adm *kadm.Client, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		_, err := adm.ListBrokers(pctx)
		if err == nil {
			return nil
		}
		select {
		case <-pctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close closes the watcher's connections.
func (w *Watcher) Close() { w.cl.Close() }

// State returns a copy of the watcher's state.
func (w *Watcher) State() State { return w.state.clone() }

// SetState replaces the watcher's state by a copy of s (read from an
// earlier process).
func (w *Watcher) SetState(s State) { w.state = s.clone() }

// Topics are the topics of the watcher's state: those it watched last.
func (w *Watcher) Topics() []string {
	if len(w.cfg.Topics) > 0 {
		return slices.Clone(w.cfg.Topics)
	}
	return slices.Sorted(maps.Keys(w.state.Base))
}

// ErrNoTopics: the group committed nothing and no topics were given, so
// there is nothing to watch.
var ErrNoTopics = errors.New("the group has no committed offsets, so there is no topic to watch: pass --topics")

// Pending returns how many records past the group's commits a
// read_committed consumer would be handed now, and on which topics. It
// reads everything afresh (commits, topics, leaders).
func (w *Watcher) Pending(ctx context.Context) (int64, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := w.setup(ctx)
	if err != nil {
		return 0, nil, err
	}
	for range scanRounds {
		work, caughtUp, err := v.fetchAll(ctx, w)
		if errors.Is(err, errMoved) {
			continue
		}
		if err != nil || work > 0 || caughtUp {
			return work, v.topics, err
		}
	}
	return 0, v.topics, fmt.Errorf("group %q: more than %d fetches of transaction markers and aborted batches", w.cfg.Group, scanRounds)
}

// RequestCounter is a kgo hook that counts, in N, the requests a client
// wrote to brokers (for the broker-requests metric).
type RequestCounter struct{ N *atomic.Int64 }

// OnBrokerWrite implements kgo.HookBrokerWrite.
func (r RequestCounter) OnBrokerWrite(_ kgo.BrokerMetadata, _ int16, _ int, _ time.Duration, _ time.Duration, err error) {
	if err == nil {
		r.N.Add(1)
	}
}

var _ kgo.HookBrokerWrite = RequestCounter{}
