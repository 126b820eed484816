package kafkahooks

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kcr-dev/kcr/notify"
)

// BenchmarkHotPath runs the real methods of Writer and Reader and of the
// bare kafka-go values they wrap, side by side (sub-benchmarks .../bare and
// .../kcr, same configuration, same in-process kfake broker), from
// GOMAXPROCS goroutines at once: run it with -cpu 1,2 to see what the
// wrappers' shared state costs under contention. scripts/bench-kafkahooks.sh
// hot prints the medians and ratios.
//
//   - write-call: WriteMessages without records, answered by kafka-go at
//     once: the wrapper's own cost per call;
//   - write-async: WriteMessages of one record to an async Writer (the
//     call hands the record to kafka-go's batch; produce is blackholed);
//   - fetch-partition / fetch-group: FetchMessage from a partition Reader
//     and a group Reader (fetches are synthetic, so records are always
//     buffered);
//   - read-commit: ReadMessage of a group Reader with CommitInterval, so
//     the commit is queued in memory (kafka-go's queue or the wrapper's).
func BenchmarkHotPath(b *testing.B) {
	produce := benchBrokers(b, kfake.BlackholeProduce())
	fetch := fetchBrokers(b)
	sides := []string{"bare", "kcr"}
	// write-call: WriteMessages without records, which kafka-go answers at
	// once: what is left is the wrapper's own cost per call (its state load
	// and counters), on the real method.
	writeSides(b, "write-call", func() *kafka.Writer { return benchWriter(produce, false, 1, time.Millisecond) })
	writeSides(b, "write-async", func() *kafka.Writer { return benchWriter(produce, true, 4096, 5*time.Millisecond) }, kafka.Message{Value: benchValue})
	type reader interface {
		FetchMessage(context.Context) (kafka.Message, error)
		ReadMessage(context.Context) (kafka.Message, error)
		Close() error
	}
	newReader := func(side, group string, commitInterval time.Duration) reader {
		cfg := benchReaderConfig(fetch, group)
		cfg.CommitInterval = commitInterval
		if side == "kcr" {
			return NewReader(cfg, WithRegistry(notify.NewRegistry()))
		}
		return kafka.NewReader(cfg)
	}
	for _, c := range []struct {
		name     string
		group    string
		interval time.Duration
		read     bool
	}{
		{"fetch-partition", "", 0, false},
		{"fetch-group", "hot-fetch", 0, false},
		{"read-commit", "hot-commit", time.Second, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			for _, side := range sides {
				b.Run(side, func(b *testing.B) {
					group := c.group
					if group != "" {
						group += "-" + side + "-" + b.Name()
					}
					r := newReader(side, group, c.interval)
					defer r.Close()
					op := r.FetchMessage
					if c.read {
						op = r.ReadMessage
					}
					hotLoop(b, func(ctx context.Context) error {
						_, err := op(ctx)
						return err
					})
				})
			}
		})
	}
}

var benchValue = make([]byte, 100)

// writeSides runs WriteMessages(msgs) on a bare kafka.Writer made by tmpl
// and on a Writer wrapping another.
func writeSides(b *testing.B, name string, tmpl func() *kafka.Writer, msgs ...kafka.Message) {
	b.Run(name, func(b *testing.B) {
		for _, side := range []string{"bare", "kcr"} {
			b.Run(side, func(b *testing.B) {
				bare := tmpl()
				var write writeFunc = bare.WriteMessages
				closeFn := bare.Close
				if side == "kcr" {
					w := NewWriter(bare, WithRegistry(notify.NewRegistry()))
					write, closeFn = w.WriteMessages, w.Close
				}
				defer closeFn()
				hotLoop(b, func(ctx context.Context) error { return write(ctx, msgs...) })
			})
		}
	})
}

// hotLoop warms op up (metadata, connections, group join) and then runs it
// from GOMAXPROCS goroutines.
func hotLoop(b *testing.B, op func(context.Context) error) {
	ctx := context.Background()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for range 100 {
		if err := op(wctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
}
