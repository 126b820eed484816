package kgohooks

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// newCluster starts an in-process kfake broker with the given topics.
func newCluster(t *testing.T, partitions int32, topics ...string) []string {
	t.Helper()
	return newKfake(t, partitions, topics...).ListenAddrs()
}

func newKfake(t *testing.T, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, _ := kafkatest.Cluster(t, kfake.SeedTopics(partitions, topics...), kafkatest.FastGroups())
	return c
}

func vals(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// connCounter is a kgo.Dialer that counts the connections it opened and
// those still open, so that tests can see what the client holds.
type connCounter struct {
	mu          sync.Mutex
	open, dials int
}

func (cc *connCounter) Dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	cc.mu.Lock()
	cc.open++
	cc.dials++
	cc.mu.Unlock()
	return &countedConn{Conn: c, cc: cc}, nil
}

// counts returns the connections open now and all dials so far.
func (cc *connCounter) counts() (open, dials int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.open, cc.dials
}

type countedConn struct {
	net.Conn
	cc   *connCounter
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.cc.mu.Lock()
		c.cc.open--
		c.cc.mu.Unlock()
	})
	return c.Conn.Close()
}

// dumpProbe registers a resource whose before hook runs after those of the
// resources registered later (reverse order), at what would be the dump
// instant, and records the connections open then.
func dumpProbe(reg *notify.Registry, cc *connCounter) *atomic.Int64 {
	var open atomic.Int64
	open.Store(-1)
	reg.Register("dump-instant", notify.Func(func(context.Context) error {
		n, _ := cc.counts()
		open.Store(int64(n))
		return nil
	}, nil))
	return &open
}

// newHooked returns a Client of kopts hooked into reg, closed at the end of
// the test.
func newHooked(t *testing.T, reg *notify.Registry, kopts []kgo.Opt, opts ...Opt) *Client {
	t.Helper()
	c, err := New(kopts, append([]Opt{WithRegistry(reg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// testCtx returns a context that ends after d or with the test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// runTxn produces n values of prefix in a transaction of c, and commits it
// if end.
func runTxn(t *testing.T, ctx context.Context, c *Client, prefix string, n int, end bool) {
	t.Helper()
	if err := c.BeginTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	for _, v := range vals(prefix, n) {
		if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if end {
		if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
}

// wantCommitted fails the test unless a read_committed reader of topic sees
// exactly want, in order.
func wantCommitted(t *testing.T, addrs []string, topic string, want []string) {
	t.Helper()
	if got := kafkatest.ReadValues(t, addrs, topic, len(want), kgo.FetchIsolationLevel(kgo.ReadCommitted())); !slices.Equal(got, want) {
		t.Errorf("read_committed sees %v, want %v", got, want)
	}
}

// newRig starts a kfake cluster with the given topics and a Registry for the
// clients under test.
func newRig(t *testing.T, partitions int32, topics ...string) ([]string, *notify.Registry) {
	t.Helper()
	return newCluster(t, partitions, topics...), notify.NewRegistry()
}

// pollUpTo polls c with PollRecords for what got still lacks of n values,
// failing the test on a fetch error, until got holds n or ctx ends.
func pollUpTo(t *testing.T, ctx context.Context, c *Client, got []string, n int) []string {
	t.Helper()
	for len(got) < n && ctx.Err() == nil {
		fs := c.PollRecords(ctx, n-len(got))
		for _, e := range fs.Errors() {
			t.Fatalf("poll: %v", e.Err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// countPrefixed counts the distinct values in seen that begin with prefix.
func countPrefixed(seen map[string]int, prefix string) int {
	n := 0
	for v := range seen {
		if strings.HasPrefix(v, prefix) {
			n++
		}
	}
	return n
}

// groupOpts are the kgo options of a member of group consuming topic from
// the start on addrs, with fetches that wait at most 100 ms, and extra.
func groupOpts(addrs []string, group, topic string, extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)}, extra...)
}
