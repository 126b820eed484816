package kafkawake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// rig is a kfake cluster with topic "t" of two partitions and group "g".
type rig struct {
	t     *testing.T
	c     *kfake.Cluster
	addrs []string
	cl    *kgo.Client
	adm   *kadm.Client
}

func newRig(t *testing.T) *rig {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "t"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &rig{t: t, c: c, addrs: addrs, cl: cl, adm: kadm.NewClient(cl)}
}

// produce produces n records to partition p.
func (r *rig) produce(p int32, n int) {
	r.t.Helper()
	for range n {
		if err := r.cl.ProduceSync(r.t.Context(), &kgo.Record{Topic: "t", Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// txn produces n records to partition p in one transaction, committed or
// aborted.
func (r *rig) txn(p int32, n int, commit bool) {
	r.t.Helper()
	kafkatest.ProduceTxn(r.t, r.addrs, "t", p, n, commit)
}

// commit commits offset at of partition p for group g.
func (r *rig) commit(p int32, at int64) {
	r.t.Helper()
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "t", Partition: p, At: at})
	if _, err := r.adm.CommitOffsets(r.t.Context(), "g", offs); err != nil {
		r.t.Fatal(err)
	}
}

// commitEnds commits the end offsets of both partitions for group g, as a
// consumer does once it has read everything.
func (r *rig) commitEnds() {
	r.t.Helper()
	ends, err := r.adm.ListEndOffsets(r.t.Context(), "t")
	if err != nil {
		r.t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) { r.commit(e.Partition, e.Offset) })
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// watcher starts a watcher of group g; mod changes its config.
func (r *rig) watcher(mod func(*Config)) (*Watcher, *syncBuf) {
	r.t.Helper()
	log := &syncBuf{}
	cfg := Config{Brokers: r.addrs, Group: "g", BrokerTimeout: 2 * time.Second, Logger: slog.New(slog.NewJSONHandler(log, nil))}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(r.t.Context(), cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(w.Close)
	return w, log
}

// pending checks Pending's count.
func pending(t *testing.T, w *Watcher, what string, want int64) {
	t.Helper()
	n, _, err := w.Pending(t.Context())
	if err != nil || n != want {
		t.Fatalf("%s: %d records pending (err %v), want %d", what, n, err, want)
	}
}

// startWait runs w.Wait and returns a channel that receives its result.
func startWait(ctx context.Context, w *Watcher) <-chan error {
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx) }()
	return done
}

// Wait returns when a record lands past the group's commits, not before,
// long-polling and polling; it counts its requests, and broker errors never
// end it.
func TestWait(t *testing.T) {
	for _, mode := range []struct {
		name string
		poll time.Duration
	}{{"long-poll", 0}, {"poll", 20 * time.Millisecond}} {
		t.Run(mode.name, func(t *testing.T) {
			r := newRig(t)
			r.produce(0, 2)
			r.produce(1, 2)
			r.commitEnds()
			var reqs atomic.Int64
			w, log := r.watcher(func(c *Config) {
				c.Poll = mode.poll
				c.Requests = func(n int) { reqs.Add(int64(n)) }
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := startWait(ctx, w)
			select {
			case err := <-done:
				t.Fatalf("Wait returned (%v) with everything committed", err)
			case <-time.After(300 * time.Millisecond):
			}
			r.produce(1, 1)
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no wake after a record past the commits; log:\n%s", log.String())
			}
			if reqs.Load() == 0 {
				t.Error("no broker requests counted")
			}

			// The broker goes away: rounds fail, nothing wakes.
			r.c.Close()
			done = startWait(ctx, w)
			select {
			case err := <-done:
				t.Fatalf("Wait returned (%v) while the broker was down", err)
			case <-time.After(time.Second):
			}
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("Wait returned %v after its context ended, want context.Canceled", err)
			}
			if !strings.Contains(log.String(), "broker request failed; watching on, no wake on errors") {
				t.Errorf("broker errors not logged:\n%s", log.String())
			}
		})
	}
}

// Transaction markers and aborted batches are not work: a group that
// committed everything a read_committed consumer was handed has nothing
// pending, though its commits stay below the end offsets, and Wait does not
// return for an aborted transaction, only for a committed one.
func TestTransactionsAreNotWork(t *testing.T) {
	r := newRig(t)
	r.txn(0, 3, true)
	r.commit(0, 3) // past the 3 records; the marker at 3 stays
	r.commit(1, 0)
	w, log := r.watcher(nil)
	pending(t, w, "a committed transaction, its 3 records committed", 0)
	r.txn(1, 2, false)
	pending(t, w, "an aborted transaction", 0)
	r.txn(0, 2, false)
	pending(t, w, "an aborted transaction after a committed one", 0)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := startWait(ctx, w)
	r.txn(1, 1, false)
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) for an aborted transaction; log:\n%s", err, log.String())
	case <-time.After(500 * time.Millisecond):
	}
	r.txn(1, 4, true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake after a committed transaction; log:\n%s", log.String())
	}
	pending(t, w, "aborted, then committed: the committed records", 4)
}

// A partition the group never committed counts from its last stable offset
// when first seen: older records are no work, a newer one is, until the
// group commits it.
func TestUncommittedPartition(t *testing.T) {
	r := newRig(t)
	r.produce(0, 1)
	r.produce(1, 2) // old records of partition 1, never committed
	r.commit(0, 1)
	w, _ := r.watcher(nil)
	pending(t, w, "partition 0 committed, partition 1 never", 0)
	r.produce(1, 1)
	pending(t, w, "a new record on the uncommitted partition", 1)
	pending(t, w, "the next reading (not taken as old)", 1)
	r.commit(1, 3)
	pending(t, w, "once the group committed it", 0)
}

// No commits and no topics: nothing to watch, said so.
func TestNoTopics(t *testing.T) {
	r := newRig(t)
	w, _ := r.watcher(nil)
	if _, _, err := w.Pending(t.Context()); err != ErrNoTopics {
		t.Fatalf("Pending: %v, want ErrNoTopics", err)
	}
	w, _ = r.watcher(func(c *Config) { c.Topics = []string{"t"} })
	pending(t, w, "topics given, nothing committed", 0)
}

// A topic deleted and created again is a new topic: all its records are
// work, though its end offsets are below the old commits, also when it
// happened while no watcher ran (the state carries the topic's id).
func TestTopicCreatedAgain(t *testing.T) {
	for _, across := range []bool{false, true} {
		t.Run(map[bool]string{false: "same-watcher", true: "across-restart"}[across], func(t *testing.T) {
			r := newRig(t)
			r.produce(0, 5)
			r.produce(1, 5)
			r.commitEnds()
			topics := func(c *Config) { c.Topics = []string{"t"} }
			w, _ := r.watcher(topics)
			pending(t, w, "everything committed", 0)
			st := w.State()
			if _, err := r.adm.DeleteTopics(t.Context(), "t"); err != nil {
				t.Fatal(err)
			}
			if _, err := r.adm.CreateTopic(t.Context(), 2, 1, nil, "t"); err != nil {
				t.Fatal(err)
			}
			// A new producer: the old one knows the old topic id.
			cl, err := kgo.NewClient(kgo.SeedBrokers(r.addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			r.cl = cl
			r.produce(1, 1)
			if across {
				w, _ = r.watcher(topics)
				w.SetState(st)
			}
			pending(t, w, "the topic created again, one record", 1)
		})
	}
}

// vanish removes group g's offsets the way named: "offsets" deletes them,
// "group" deletes the group (what expiry of an empty group's offsets
// amounts to).
func (r *rig) vanish(how string) {
	r.t.Helper()
	var err error
	if how == "offsets" {
		var resp kadm.DeleteOffsetsResponses
		if resp, err = r.adm.DeleteOffsets(r.t.Context(), "g", kadm.TopicsSet{"t": {0: {}, 1: {}}}); err == nil {
			err = resp.Error()
		}
	} else {
		var resp kadm.DeleteGroupResponse
		if resp, err = r.adm.DeleteGroup(r.t.Context(), "g"); err == nil {
			err = resp.Err
		}
	}
	if err != nil {
		r.t.Fatalf("delete the %s: %v", how, err)
	}
}

// The group's committed offsets vanish while the service sleeps. The
// service's image recorded them, and kafkahooks/kgohooks continue from them:
// for the watcher the group is still where it last committed. So nothing is
// pending while nothing new arrives, and a record produced after its last
// commit, even one produced before the offsets vanished, is. With and
// without topics given (then they are those the group had committed).
func TestOffsetsGone(t *testing.T) {
	for _, how := range []string{"offsets", "group"} {
		for _, topics := range []bool{true, false} {
			t.Run(how+map[bool]string{true: "/topics-given", false: "/topics-from-commits"}[topics], func(t *testing.T) {
				r := newRig(t)
				r.produce(0, 2)
				r.produce(1, 2)
				r.commitEnds()
				w, _ := r.watcher(func(c *Config) {
					if topics {
						c.Topics = []string{"t"}
					}
				})
				pending(t, w, "everything committed", 0)
				r.produce(0, 1)
				r.vanish(how)
				pending(t, w, "offsets gone, a record produced before", 1)
				r.commit(0, 3)
				pending(t, w, "the record committed", 0)
				r.vanish(how)
				pending(t, w, "offsets gone, no new record", 0)
				pending(t, w, "offsets gone, no new record, next reading", 0)
				r.produce(1, 1)
				pending(t, w, "offsets gone, a new record", 1)
				pending(t, w, "offsets gone, a new record, next reading", 1)
			})
		}
	}
}

// A leader that moves while Wait runs is no work: Wait reads the leaders
// again and returns for the next record, on the new leader.
func TestLeaderMoves(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.NumBrokers(2), kfake.SeedTopics(1, "t"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := &rig{t: t, c: c, addrs: addrs, cl: cl, adm: kadm.NewClient(cl)}
	r.produce(0, 2)
	r.commit(0, 2)
	w, log := r.watcher(nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := startWait(ctx, w)
	time.Sleep(200 * time.Millisecond) // Wait fetches from the first leader
	meta, err := r.adm.Metadata(t.Context(), "t")
	if err != nil {
		t.Fatal(err)
	}
	leader := meta.Topics["t"].Partitions[0].Leader
	if err := c.MoveTopicPartition("t", 0, 1-leader); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) on a leader move; log:\n%s", err, log.String())
	case <-time.After(time.Second):
	}
	r.produce(0, 1)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no wake after a record on the new leader; log:\n%s", log.String())
	}
}

// A run of failed rounds ends in one log line that says how many rounds
// failed and what failed last: the record that lands meanwhile wakes the
// service once the broker answers again.
func TestWaitOutageLogged(t *testing.T) {
	r := newRig(t)
	r.produce(0, 1)
	r.commitEnds()
	var fenced atomic.Int32
	r.c.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r.c.KeepControl()
		if fenced.Add(1) > 3 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.ErrorCode = kerr.FencedLeaderEpoch.Code
		return resp, nil, true
	})
	w, log := r.watcher(nil)
	r.produce(1, 1)
	if err := w.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	var line struct {
		Msg          string  `json:"msg"`
		FailedRounds int     `json:"failed_rounds"`
		FailingMS    float64 `json:"failing_ms"`
		LastErr      string  `json:"last_err"`
	}
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "the brokers answer again") {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line.FailedRounds != 3 || !strings.Contains(line.LastErr, "FENCED_LEADER_EPOCH") || line.FailingMS <= 0 {
		t.Fatalf("outage logged as %+v, want 3 failed rounds, the last FENCED_LEADER_EPOCH; log:\n%s", line, log.String())
	}
}

// The wait after a failed round doubles up to retryMax while the failures
// are of one kind, and starts over when the broker takes connections again
// (or stops taking them).
func TestNextRetry(t *testing.T) {
	refused := fmt.Errorf("unable to dial: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	cut := fmt.Errorf("fetch from broker 1: %w", io.EOF)
	var retry time.Duration
	var prev error
	var got []time.Duration
	for _, err := range []error{refused, refused, refused, refused, refused, cut, cut, cut, refused} {
		retry = nextRetry(retry, prev, err)
		prev = err
		got = append(got, retry)
	}
	want := []time.Duration{retryMin, 2 * retryMin, 4 * retryMin, retryMax, retryMax, retryMin, 2 * retryMin, 4 * retryMin, retryMin}
	if !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
}

// The backlog's age is the time its oldest record is known to have
// waited: a record stamped a year ago (a replay, a mirror that keeps
// timestamps) is only as old as the watcher has seen it, and one stamped
// an hour ahead ages from when it was seen, as any other.
func TestBacklogAgeClamped(t *testing.T) {
	r := newRig(t)
	r.commit(0, 0)
	r.commit(1, 0)
	w, _ := r.watcher(func(c *Config) { c.Topics = []string{"t"} })
	stamp := func(p int32, ts time.Time) {
		if err := r.cl.ProduceSync(t.Context(), &kgo.Record{Topic: "t", Partition: p, Value: []byte("x"), Timestamp: ts}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	backlog := func() Backlog {
		b, err := w.Backlog(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		what string
		ts   time.Time
	}{
		{"a year ago", time.Now().AddDate(-1, 0, 0)},
		{"an hour ahead", time.Now().Add(time.Hour)},
	} {
		r.commitEnds()
		stamp(0, c.ts)
		seen := time.Now()
		if b := backlog(); b.Records != 1 || b.Age(time.Now()) > time.Since(seen)+time.Second {
			t.Errorf("stamped %s: backlog %+v, %v old; want 1 record, about 0 old", c.what, b, b.Age(time.Now()))
		}
		time.Sleep(300 * time.Millisecond)
		b := backlog()
		if age := b.Age(time.Now()); age < 300*time.Millisecond || age > time.Since(seen)+time.Second {
			t.Errorf("stamped %s, seen %v ago: backlog %v old", c.what, time.Since(seen), age)
		}
	}
	// A record stamped as it was written ages from its stamp.
	r.commitEnds()
	stamp(1, time.Now().Add(-time.Minute))
	backlog()
	time.Sleep(200 * time.Millisecond)
	if age := backlog().Age(time.Now()); age > 2*time.Second {
		t.Errorf("a record a minute old, seen 200 ms: backlog %v old, want the time seen", age)
	}
}
