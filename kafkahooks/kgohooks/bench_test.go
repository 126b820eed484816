package kgohooks

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// producer is what both sides of the benchmarks call.
type producer interface {
	Produce(context.Context, *kgo.Record, func(*kgo.Record, error))
	ProduceSync(context.Context, ...*kgo.Record) kgo.ProduceResults
	Flush(context.Context) error
}

// benchProducers runs f against a bare kgo client and a kgohooks one on
// the same kfake cluster, so their ns/op sit side by side.
func benchProducers(b *testing.B, f func(b *testing.B, p producer)) {
	_, addrs := kafkatest.Cluster(b, kfake.SeedTopics(1, "bench"))
	opts := []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("bench")}
	b.Run("bare", func(b *testing.B) {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		f(b, cl)
	})
	b.Run("kgohooks", func(b *testing.B) {
		cl, err := New(opts, WithRegistry(notify.NewRegistry()))
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		f(b, cl)
	})
}

// BenchmarkProduce is an async Produce call (the wrapper's gate on the hot
// path); the records are flushed before the timer stops.
func BenchmarkProduce(b *testing.B) {
	benchProduceLoop(b, func(_ *testing.B, ctx context.Context, p producer, r *kgo.Record) {
		p.Produce(ctx, r, nil)
	})
}

// BenchmarkProduceSync is one acknowledged record per call.
func BenchmarkProduceSync(b *testing.B) {
	benchProduceLoop(b, func(b *testing.B, ctx context.Context, p producer, r *kgo.Record) {
		if err := p.ProduceSync(ctx, r).FirstErr(); err != nil {
			b.Fatal(err)
		}
	})
}

// benchProduceLoop times b.N calls of call with 100-byte records on each
// producer, then flushes.
func benchProduceLoop(b *testing.B, call func(*testing.B, context.Context, producer, *kgo.Record)) {
	benchProducers(b, func(b *testing.B, p producer) {
		ctx := context.Background()
		v := make([]byte, 100)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			call(b, ctx, p, &kgo.Record{Value: v})
		}
		if err := p.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	})
}
