package kafkahooks

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// fake is an in-process kfake cluster whose listener records the client id
// of every request, so that tests see identities from the broker's side.
type fake struct {
	c     *kfake.Cluster
	addrs []string
	port  int
	sniff *sniffer
}

func newFake(t testing.TB, partitions int32, topics ...string) *fake {
	t.Helper()
	return newFakeWith(t, nil, partitions, topics...)
}

// newFakeWith is newFake with extra kfake options.
func newFakeWith(t testing.TB, extra []kfake.Opt, partitions int32, topics ...string) *fake {
	t.Helper()
	s := &sniffer{}
	opts := []kfake.Opt{
		kafkatest.FastGroups(),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return &sniffListener{Listener: ln, s: s}, nil
		}),
	}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	c, addrs := kafkatest.Cluster(t, append(opts, extra...)...)
	_, p, _ := net.SplitHostPort(addrs[0])
	port, _ := strconv.Atoi(p)
	return &fake{c: c, addrs: addrs, port: port, sniff: s}
}

type sniffed struct {
	key      int16
	clientID string
}

type sniffer struct {
	mu   sync.Mutex
	seen []sniffed
}

func (s *sniffer) add(key int16, id string) {
	s.mu.Lock()
	s.seen = append(s.seen, sniffed{key, id})
	s.mu.Unlock()
}

// mark returns a position; since returns the client ids of requests with
// the given API key seen after it.
func (s *sniffer) mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func (s *sniffer) since(mark int, key int16) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := map[string]int{}
	for _, x := range s.seen[mark:] {
		if x.key == key {
			ids[x.clientID]++
		}
	}
	return ids
}

type sniffListener struct {
	net.Listener
	s *sniffer
}

func (l *sniffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, s: l.s}, nil
}

// sniffConn parses the request headers (size, key, version, correlation id,
// client id) of the bytes the broker reads.
type sniffConn struct {
	net.Conn
	s   *sniffer
	mu  sync.Mutex
	buf []byte
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.buf = append(c.buf, p[:n]...)
		for len(c.buf) >= 4 {
			size := int(binary.BigEndian.Uint32(c.buf))
			if len(c.buf) < 4+size {
				break
			}
			f := c.buf[4 : 4+size]
			if len(f) >= 10 {
				key := int16(binary.BigEndian.Uint16(f))
				l := int(int16(binary.BigEndian.Uint16(f[8:])))
				id := ""
				if l > 0 && 10+l <= len(f) {
					id = string(f[10 : 10+l])
				}
				c.s.add(key, id)
			}
			c.buf = c.buf[4+size:]
		}
		c.mu.Unlock()
	}
	return n, err
}

const (
	keyProduce = 0
	keyFetch   = 1
	keyJoin    = 11
)

// established counts this network namespace's ESTABLISHED TCP connections
// to port, i.e. client sockets still connected to the fake broker.
func established(t testing.TB, port int) int {
	t.Helper()
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "01" {
				continue
			}
			rem := fields[2]
			i := strings.LastIndexByte(rem, ':')
			p, err := strconv.ParseUint(rem[i+1:], 16, 16)
			if err == nil && int(p) == port {
				n++
			}
		}
		f.Close()
	}
	return n
}

// logSink is a slog.Handler that keeps records for assertions and forwards
// them to t.Log while the test runs (with -v).
type logSink struct {
	mu   sync.Mutex
	recs []slog.Record
	t    testing.TB
	done bool
}

func newLog(t testing.TB) (*slog.Logger, *logSink) {
	s := &logSink{t: t}
	t.Cleanup(func() {
		s.mu.Lock()
		s.done = true
		s.mu.Unlock()
	})
	return slog.New(s), s
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *logSink) WithGroup(string) slog.Handler            { return s }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, r.Clone())
	if !s.done && testing.Verbose() {
		var b strings.Builder
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		s.t.Logf("%s %s%s", r.Level, r.Message, b.String())
	}
	return nil
}

func (s *logSink) count(level slog.Level) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		if r.Level == level {
			n++
		}
	}
	return n
}

// hook registers a probe resource. Registered before the resource under
// test, its BeforeCheckpoint runs after that resource's and its AfterRestore
// before that resource's.
func hook(reg *notify.Registry, before func(context.Context) error, after func(context.Context, notify.Event) error) {
	reg.Register("probe", notify.Func(before, after))
}

// waitFor polls cond every 10ms until it holds or d passes.
var waitFor = wait.For

// decodeReport turns a hook's report, as notify hands it over, back into
// the typed report R, as a reader of the manifest would.
func decodeReport[R any](t *testing.T, details map[string]any) R {
	t.Helper()
	var r R
	b, err := json.Marshal(details)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		t.Fatalf("decoding report %v: %v", details, err)
	}
	return r
}

// seqWriter returns write(from, to), which writes the values from..to-1 to
// topic, a record a batch with acks from all, through a Writer of its own
// that no checkpoint touches.
func seqWriter(t *testing.T, addrs []string, topic string, log *slog.Logger) func(from, to int) {
	w := NewWriter(&kafka.Writer{Addr: kafka.TCP(addrs...), Topic: topic, BatchSize: 1, RequiredAcks: kafka.RequireAll},
		WithRegistry(notify.NewRegistry()), WithLogger(log))
	t.Cleanup(func() { w.Close() })
	return func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte(strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// writeBatch writes the values 0..n-1 to topic in one batch, through a
// Writer of its own that no checkpoint touches.
func writeBatch(t testing.TB, addrs []string, topic string, log *slog.Logger, n int) {
	t.Helper()
	w := NewWriter(&kafka.Writer{Addr: kafka.TCP(addrs...), Topic: topic, BatchSize: 100, BatchTimeout: time.Millisecond},
		WithRegistry(notify.NewRegistry()), WithLogger(log))
	defer w.Close()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Value: []byte(strconv.Itoa(i))}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// fetchCommitInOrder fetches n records from r, which must come at offsets
// 0..n-1, and commits each.
func fetchCommitInOrder(t *testing.T, ctx context.Context, r *Reader, n int) {
	t.Helper()
	for i := range n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("fetch offset %d: %v", i, err)
		}
		if m.Offset != int64(i) {
			t.Fatalf("offset %d, want %d", m.Offset, i)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// has tells whether a record of level with msg holding substr was logged.
func (s *logSink) has(level slog.Level, substr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		if r.Level == level && strings.Contains(r.Message, substr) {
			return true
		}
	}
	return false
}

// attr returns attribute key of the first record of level whose message
// holds substr.
func (s *logSink) attr(level slog.Level, substr, key string) (slog.Value, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		if r.Level != level || !strings.Contains(r.Message, substr) {
			continue
		}
		var v slog.Value
		found := false
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				v, found = a.Value, true
				return false
			}
			return true
		})
		return v, found
	}
	return slog.Value{}, false
}

// consumeCommitting fetches and commits every message of each reader, in a
// goroutine a reader, until a fetch fails (ctx ends).
func consumeCommitting(ctx context.Context, readers ...*Reader) {
	for _, r := range readers {
		go func() {
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					return
				}
				r.CommitMessages(ctx, m)
			}
		}()
	}
}

// groupRig starts a fake cluster with topic of partitions holding the
// values 0..n-1, and returns it with an admin client, a Registry for the
// clients under test and a log.
func groupRig(t *testing.T, partitions int32, topic string, n int) (*fake, *kadm.Client, *notify.Registry, *slog.Logger, *logSink) {
	t.Helper()
	k := newFake(t, partitions, topic)
	log, sink := newLog(t)
	writeBatch(t, k.addrs, topic, log, n)
	return k, admin(t, k.addrs), notify.NewRegistry(), log, sink
}

// waitingLen returns how many partitions have commits waiting at the gate.
func (r *Reader) waitingLen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiting)
}
