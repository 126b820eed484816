package standby

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// lagWatcher reads the lag of the service's consumer group: committed
// offsets against end offsets, through kadm. The service does not go to
// sleep while its group has lag, and is woken when lag appears while it
// sleeps.
//
// A partition without a committed offset counts from its base: the last
// offset the group was seen to commit there, or, for a partition it never
// committed, its end offset when the supervisor first saw it. So the
// records there before (which a consumer that starts at the end would
// never read) neither wake the service nor keep it awake, and every record
// after does, until the group commits the partition. And when the group's
// offsets vanish while the service sleeps (deleted, or expired with the
// group empty), the service, whose hooks go on from the offsets its image
// recorded (kafkahooks/kgohooks rule H8), is woken by the records past
// them, not by the old ones, and its topics stay watched.
type lagWatcher struct {
	o    *Options
	log  *slog.Logger
	cl   *kgo.Client
	adm  *kadm.Client
	reqs atomic.Int64 // requests written to brokers, for Observer.BrokerRequests

	// base, committed and parts are used by one goroutine at a time: the
	// supervisor's before a checkpoint, watch's while the service sleeps.
	base      map[string]map[int32]int64 // persisted in the state file
	committed map[string]map[int32]int64 // of the last full poll
	parts     map[string][]int32         // of the last full poll
}

// newLagWatcher connects to the brokers and checks that they answer.
func newLagWatcher(ctx context.Context, o *Options, log *slog.Logger) (*lagWatcher, error) {
	w := &lagWatcher{o: o, log: log}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...), kgo.ClientID("kcr-standby"),
		kgo.WithHooks(requestCounter{&w.reqs}),
		// A broker that is down must not make a poll wait long: the next
		// poll asks again.
		kgo.RequestRetries(0), kgo.RetryTimeout(max(o.Poll, time.Second)),
		kgo.DialTimeout(max(2*o.Poll, time.Second)))
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrBadOption, o.Brokers, err)
	}
	w.cl, w.adm = cl, kadm.NewClient(cl)
	pctx, cancel := context.WithTimeout(ctx, o.BrokerTimeout)
	defer cancel()
	if _, err := w.adm.ListBrokers(pctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("--brokers %v: no broker answered within %v (%v): start the broker or fix --brokers", o.Brokers, o.BrokerTimeout, err)
	}
	return w, nil
}

func (w *lagWatcher) close() { w.cl.Close() }

// watch polls until it finds lag, then sends "kafka" on wake and returns;
// it returns when ctx ends. Broker errors are logged (once per outage) and
// never wake the service.
func (w *lagWatcher) watch(ctx context.Context, wake chan<- string) {
	tick := time.NewTicker(w.o.Poll)
	defer tick.Stop()
	failing := false
	polls := 0
	last := w.reqs.Load()
	lastAt := time.Now()
	defer func() { w.o.Observer.BrokerRequests(int(w.reqs.Load() - last)) }()
	for {
		if n := w.reqs.Load(); time.Since(lastAt) >= time.Second {
			w.o.Observer.BrokerRequests(int(n - last))
			last, lastAt = n, time.Now()
		}
		// Committed offsets do not move while the service sleeps (its
		// group has no member), so most polls ask only for the end
		// offsets, one ListOffsets request; a full poll (commits, topics,
		// partitions) runs first, every fullEvery polls, and to confirm
		// lag before waking.
		var lag int64
		var topics []string
		var err error
		if polls%fullEvery == 0 || w.parts == nil {
			lag, topics, err = w.lag(ctx)
		} else if lag, err = w.quickLag(ctx); err == nil && lag > 0 {
			lag, topics, err = w.lag(ctx)
		}
		polls++
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				w.log.Warn("standby: lag poll failed; polling on, no wake on errors", "group", w.o.Group, "err", err)
			}
			failing = true
		default:
			if failing {
				w.log.Info("standby: lag poll works again", "group", w.o.Group)
			}
			failing = false
			if lag > 0 {
				w.log.Info("standby: consumer lag", "group", w.o.Group, "lag", lag, "topics", topics)
				select {
				case wake <- "kafka":
				default:
				}
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// errNoTopics: the group committed nothing and no --topics were given.
var errNoTopics = errors.New("the group has no committed offsets, so there is no topic to watch: pass --topics")

// lag returns the group's total lag on its topics (see lagWatcher).
func (w *lagWatcher) lag(ctx context.Context) (int64, []string, error) {
	pctx, cancel := context.WithTimeout(ctx, max(5*w.o.Poll, 2*time.Second))
	defer cancel()
	committed, err := w.adm.FetchOffsets(pctx, w.o.Group)
	if err == nil {
		err = committed.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// Deleted, or expired with its offsets while empty: no commits.
		committed, err = nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("fetch the committed offsets of group %q: %w", w.o.Group, err)
	}
	topics := w.o.Topics
	remembered := map[string]bool{}
	if len(topics) == 0 {
		topics = committed.Partitions().Topics()
		// Topics whose commits vanished (see base) are still the
		// service's: its image recorded the offsets it goes on from.
		for t := range w.base {
			if !slices.Contains(topics, t) {
				topics = append(topics, t)
				remembered[t] = true
			}
		}
		slices.Sort(topics)
	}
	if len(topics) == 0 {
		return 0, nil, errNoTopics
	}
	ends, err := w.adm.ListEndOffsets(pctx, topics...)
	if err != nil {
		return 0, topics, fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	// A remembered topic may be gone for good: not a reason to poll
	// nothing.
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil && !remembered[e.Topic] && err == nil {
			err = e.Err
		}
	})
	if err != nil {
		return 0, topics, fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	w.committed = map[string]map[int32]int64{}
	if w.base == nil {
		w.base = map[string]map[int32]int64{}
	}
	committed.Each(func(c kadm.OffsetResponse) {
		if c.At >= 0 {
			if w.committed[c.Topic] == nil {
				w.committed[c.Topic] = map[int32]int64{}
			}
			w.committed[c.Topic][c.Partition] = c.At
			if w.base[c.Topic] == nil {
				w.base[c.Topic] = map[int32]int64{}
			}
			w.base[c.Topic][c.Partition] = c.At
		}
	})
	w.parts = map[string][]int32{}
	endOffs := map[string]map[int32]int64{}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil || e.Partition < 0 || e.Offset < 0 {
			return
		}
		w.parts[e.Topic] = append(w.parts[e.Topic], e.Partition)
		if endOffs[e.Topic] == nil {
			endOffs[e.Topic] = map[int32]int64{}
		}
		endOffs[e.Topic][e.Partition] = e.Offset
	})
	return w.lagOf(endOffs), topics, nil
}

// lagOf is the lag of the end offsets ends against the last committed
// offsets and base.
func (w *lagWatcher) lagOf(ends map[string]map[int32]int64) int64 {
	if w.base == nil {
		w.base = map[string]map[int32]int64{}
	}
	var lag int64
	for topic, ps := range ends {
		for p, end := range ps {
			lag += w.partitionLag(topic, p, end)
		}
	}
	return lag
}

// partitionLag is the lag of one partition whose end offset is end: from
// the group's commit, or from base for a partition it never committed.
func (w *lagWatcher) partitionLag(topic string, p int32, end int64) int64 {
	from, ok := w.committed[topic][p]
	if !ok {
		if w.base[topic] == nil {
			w.base[topic] = map[int32]int64{}
		}
		if from, ok = w.base[topic][p]; !ok {
			from = end
			w.base[topic][p] = end
		}
	}
	return max(0, end-from)
}

// fullEvery is how many polls in a row may use the committed offsets and
// partitions of the last full poll.
const fullEvery = 50

// quickLag is lag with the committed offsets and partitions of the last
// full poll: one ListOffsets request, sharded by kgo to the partitions'
// leaders from its cached metadata.
func (w *lagWatcher) quickLag(ctx context.Context) (int64, error) {
	pctx, cancel := context.WithTimeout(ctx, max(5*w.o.Poll, 2*time.Second))
	defer cancel()
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	for topic, ps := range w.parts {
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range ps {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rp.Timestamp = -1 // the end
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	ends := map[string]map[int32]int64{}
	for _, sh := range w.cl.RequestSharded(pctx, req) {
		if sh.Err != nil {
			return 0, fmt.Errorf("list the end offsets: %w", sh.Err)
		}
		for _, t := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return 0, fmt.Errorf("list the end offset of %s/%d: %w", t.Topic, p.Partition, err)
				}
				if ends[t.Topic] == nil {
					ends[t.Topic] = map[int32]int64{}
				}
				ends[t.Topic][p.Partition] = p.Offset
			}
		}
	}
	return w.lagOf(ends), nil
}

// requestCounter counts the requests kcr standby writes to brokers.
type requestCounter struct{ n *atomic.Int64 }

func (r requestCounter) OnBrokerWrite(_ kgo.BrokerMetadata, _ int16, _ int, _ time.Duration, _ time.Duration, err error) {
	if err == nil {
		r.n.Add(1)
	}
}

var _ kgo.HookBrokerWrite = requestCounter{}

// listen opens --listen, which must be free.
func listen(addr string) (*net.TCPListener, error) {
	// Not MPTCP (Go's default for listeners): CRIU cannot dump it.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --listen %s: %v: choose a free address", ErrBadOption, addr, err)
	}
	return ln.(*net.TCPListener), nil
}
