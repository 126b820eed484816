package kafkahooks

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// Hot-path benchmarks: the same kafka.Writer / kafka.Reader configuration,
// bare and wrapped, against the same broker: a kfake cluster started in the
// benchmark (produce blackholed, fetch synthetic, so the broker's own work
// stays small), or the brokers in $KCR_KAFKA_BROKERS (comma-separated; the
// topic kcr-bench is auto-created). Compare with scripts/bench-kafkahooks.sh, which prints
// the medians side by side.

const benchTopic = "kcr-bench"

func benchBrokers(b *testing.B, opts ...kfake.Opt) []string {
	if env := os.Getenv("KCR_KAFKA_BROKERS"); env != "" {
		return strings.Split(env, ",")
	}
	_, addrs := kafkatest.Cluster(b, append([]kfake.Opt{kfake.SeedTopics(1, benchTopic)}, opts...)...)
	return addrs
}

type produceCase struct {
	name  string
	tmpl  func(addrs []string) *kafka.Writer
	batch int // messages per WriteMessages call
	par   bool
}

var produceCases = []produceCase{
	// One synchronous round trip per call.
	{name: "sync", batch: 1, tmpl: func(addrs []string) *kafka.Writer {
		return benchWriter(addrs, false, 1, time.Millisecond)
	}},
	// Many goroutines sharing a writer, batches of 100.
	{name: "sync-parallel", batch: 10, par: true, tmpl: func(addrs []string) *kafka.Writer {
		return benchWriter(addrs, false, 100, time.Millisecond)
	}},
	// Async: the cost of handing one message to the writer.
	{name: "async", batch: 1, tmpl: func(addrs []string) *kafka.Writer {
		return benchWriter(addrs, true, 1000, 5*time.Millisecond)
	}},
}

func benchWriter(addrs []string, async bool, batchSize int, batchTimeout time.Duration) *kafka.Writer {
	return &kafka.Writer{
		Addr:                   kafka.TCP(addrs...),
		Topic:                  benchTopic,
		RequiredAcks:           kafka.RequireOne,
		Async:                  async,
		BatchSize:              batchSize,
		BatchTimeout:           batchTimeout,
		AllowAutoTopicCreation: true,
		Transport:              &kafka.Transport{ClientID: "bench"},
	}
}

type writeFunc func(ctx context.Context, msgs ...kafka.Message) error

func runProduce(b *testing.B, c produceCase, write writeFunc) {
	msgs := make([]kafka.Message, c.batch)
	for i := range msgs {
		msgs[i] = kafka.Message{Value: make([]byte, 100)}
	}
	ctx := context.Background()
	if err := write(ctx, msgs...); err != nil { // warm up: metadata, connections
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if c.par {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := write(ctx, msgs...); err != nil {
					b.Error(err)
					return
				}
			}
		})
		return
	}
	for b.Loop() {
		if err := write(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkProduceBare(b *testing.B) {
	addrs := benchBrokers(b, kfake.BlackholeProduce())
	for _, c := range produceCases {
		b.Run(c.name, func(b *testing.B) {
			w := c.tmpl(addrs)
			defer w.Close()
			runProduce(b, c, w.WriteMessages)
			b.StopTimer()
		})
	}
}

func BenchmarkProduceWrapper(b *testing.B) {
	addrs := benchBrokers(b, kfake.BlackholeProduce())
	for _, c := range produceCases {
		b.Run(c.name, func(b *testing.B) {
			w := NewWriter(c.tmpl(addrs), WithRegistry(notify.NewRegistry()))
			defer w.Close()
			runProduce(b, c, w.WriteMessages)
			b.StopTimer()
		})
	}
}

func benchReaderConfig(addrs []string, group string) kafka.ReaderConfig {
	c := kafka.ReaderConfig{
		Brokers:  addrs,
		Topic:    benchTopic,
		MinBytes: 1,
		MaxBytes: 10 << 20,
		MaxWait:  100 * time.Millisecond,
		Dialer:   &kafka.Dialer{ClientID: "bench", Timeout: 5 * time.Second},
	}
	if group != "" {
		c.GroupID = group
		c.HeartbeatInterval = 100 * time.Millisecond
		c.SessionTimeout = 6 * time.Second
		c.StartOffset = kafka.FirstOffset
	}
	return c
}

type fetcher interface {
	FetchMessage(context.Context) (kafka.Message, error)
	Close() error
}

func runFetch(b *testing.B, r fetcher) {
	defer r.Close()
	ctx := context.Background()
	if _, err := r.FetchMessage(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := r.FetchMessage(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

// The fetch benchmarks need a topic with plenty of records: with kfake it is
// synthetic; with real brokers, fill kcr-bench first.
func fetchBrokers(b *testing.B) []string {
	return benchBrokers(b, kfake.SyntheticFetch(kfake.SyntheticBatch{}), kfake.GroupMinSessionTimeout(100*time.Millisecond))
}

func BenchmarkFetchBare(b *testing.B) {
	addrs := fetchBrokers(b)
	b.Run("partition", func(b *testing.B) { runFetch(b, kafka.NewReader(benchReaderConfig(addrs, ""))) })
	b.Run("group", func(b *testing.B) { runFetch(b, kafka.NewReader(benchReaderConfig(addrs, "bench-bare"))) })
}

func BenchmarkFetchWrapper(b *testing.B) {
	addrs := fetchBrokers(b)
	b.Run("partition", func(b *testing.B) {
		runFetch(b, NewReader(benchReaderConfig(addrs, ""), WithRegistry(notify.NewRegistry())))
	})
	b.Run("group", func(b *testing.B) {
		runFetch(b, NewReader(benchReaderConfig(addrs, "bench-wrapped"), WithRegistry(notify.NewRegistry())))
	})
}

// TestPairedOverhead measures the Writer's overhead robustly on a busy
// machine: a bare kafka.Writer and a Writer with the same settings, against
// the same broker, take turns running short blocks of writes; the result is
// the median of the per-pair ratios wrapper/bare, which slow drifts in the
// machine's load do not bias. It is skipped unless KCR_BENCH_PAIRED is set
// (to the number of pairs, e.g. 40); scripts/bench-kafkahooks.sh paired runs it.
func TestPairedOverhead(t *testing.T) {
	pairs, _ := strconv.Atoi(os.Getenv("KCR_BENCH_PAIRED"))
	if pairs <= 0 {
		t.Skip("set KCR_BENCH_PAIRED=<pairs> to run")
	}
	var addrs []string
	if env := os.Getenv("KCR_KAFKA_BROKERS"); env != "" {
		addrs = strings.Split(env, ",")
	} else {
		_, addrs = kafkatest.Cluster(t, kfake.SeedTopics(1, benchTopic), kfake.BlackholeProduce())
	}
	for _, c := range []struct {
		produceCase
		ops int // writes per block
	}{
		{produceCases[0], 500},
		{produceCases[2], 50000},
		// WriteMessages without records from GOMAXPROCS goroutines: the
		// wrapper's own cost per call, with its counters contended.
		{produceCase{name: "call-par", par: true, tmpl: func(addrs []string) *kafka.Writer {
			return benchWriter(addrs, false, 1, time.Millisecond)
		}}, 400000},
	} {
		bare := c.tmpl(addrs)
		wrapped := NewWriter(c.tmpl(addrs), WithRegistry(notify.NewRegistry()))
		msgs := make([]kafka.Message, c.batch)
		for i := range msgs {
			msgs[i] = kafka.Message{Value: make([]byte, 100)}
		}
		ctx := context.Background()
		block := func(write writeFunc) float64 { // ns per write
			start := time.Now()
			procs := 1
			if c.par {
				procs = runtime.GOMAXPROCS(0)
			}
			var wg sync.WaitGroup
			for range procs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range c.ops / procs {
						if err := write(ctx, msgs...); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			return float64(time.Since(start)) / float64(c.ops)
		}
		block(bare.WriteMessages) // warm up
		block(wrapped.WriteMessages)
		ratios := make([]float64, 0, pairs)
		var bareNs, wrapNs []float64
		for i := range pairs {
			var tb, tw float64
			if i%2 == 0 {
				tb, tw = block(bare.WriteMessages), block(wrapped.WriteMessages)
			} else {
				tw, tb = block(wrapped.WriteMessages), block(bare.WriteMessages)
			}
			ratios = append(ratios, tw/tb)
			bareNs = append(bareNs, tb)
			wrapNs = append(wrapNs, tw)
		}
		bare.Close()
		wrapped.Close()
		q := func(xs []float64, p float64) float64 {
			s := slices.Clone(xs)
			slices.Sort(s)
			return s[int(p*float64(len(s)-1)+0.5)]
		}
		fmt.Printf("paired %-8s -cpu %d  bare %8.1f ns/op  wrapper %8.1f ns/op  wrapper/bare median %+6.2f%%  (IQR %+.2f%% .. %+.2f%%, %d pairs of %d writes)\n",
			c.name, runtime.GOMAXPROCS(0), q(bareNs, 0.5), q(wrapNs, 0.5), 100*(q(ratios, 0.5)-1), 100*(q(ratios, 0.25)-1), 100*(q(ratios, 0.75)-1), pairs, c.ops)
	}
}
