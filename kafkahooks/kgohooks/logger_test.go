package kgohooks

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/notify"
)

// recLogger is a kgo.Logger that keeps every line at warn level or above.
type recLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *recLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }
func (l *recLogger) Log(level kgo.LogLevel, msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprint(level, " ", msg, " ", kv))
}

func (l *recLogger) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// The clients New builds only to read the user's options never dial; they
// must not write their refused dials into the application's kgo logger (a
// warning for every group consumer, which pointed at a broker problem that
// did not exist).
func TestOptionProbeLogsNothing(t *testing.T) {
	cl := newKfake(t, 1, "t")
	log := &recLogger{}
	reg := notify.NewRegistry()
	c, err := New([]kgo.Opt{kgo.SeedBrokers(cl.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.WithLogger(log)}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t, 15*time.Second)
	p, err := kgo.NewClient(kgo.SeedBrokers(cl.ListenAddrs()...), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.ProduceSync(ctx, &kgo.Record{Value: []byte("a")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if fs := c.PollFetches(ctx); fs.NumRecords() == 0 {
		t.Fatalf("no record consumed: %v", fs.Errors())
	}
	for _, l := range log.all() {
		if strings.Contains(l, errNoDial.Error()) {
			t.Errorf("the application's kgo logger got the option probe's dial: %s", l)
		}
	}
}
