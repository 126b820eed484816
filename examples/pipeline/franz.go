package main

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
)

// kgoFetcher is a Fetcher on a kgohooks.Client (-client franz): one record
// per poll, so that nothing polled waits in the adapter across a checkpoint.
type kgoFetcher struct {
	cl *kgohooks.Client

	mu     sync.Mutex
	handed map[kafkaPos]*kgo.Record // handed out, not committed: commits need kgo's record
}

type kafkaPos struct {
	topic     string
	partition int32
	offset    int64
}

func newKgoFetcher(cl *kgohooks.Client) *kgoFetcher {
	return &kgoFetcher{cl: cl, handed: map[kafkaPos]*kgo.Record{}}
}

func (f *kgoFetcher) FetchMessage(ctx context.Context) (kafka.Message, error) {
	for {
		fs := f.cl.PollRecords(ctx, 1)
		var m *kgo.Record
		fs.EachRecord(func(r *kgo.Record) { m = r })
		if m != nil {
			f.mu.Lock()
			f.handed[kafkaPos{m.Topic, m.Partition, m.Offset}] = m
			f.mu.Unlock()
			return toKafka(m), nil
		}
		if err := ctx.Err(); err != nil {
			return kafka.Message{}, err
		}
		if err := fs.Err0(); err != nil {
			return kafka.Message{}, err
		}
	}
}

func (f *kgoFetcher) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	rs := make([]*kgo.Record, 0, len(msgs))
	f.mu.Lock()
	for _, m := range msgs {
		if r := f.handed[kafkaPos{m.Topic, int32(m.Partition), m.Offset}]; r != nil {
			rs = append(rs, r)
		}
	}
	f.mu.Unlock()
	if err := f.cl.CommitRecords(ctx, rs...); err != nil {
		return err
	}
	f.mu.Lock()
	for _, r := range rs {
		delete(f.handed, kafkaPos{r.Topic, r.Partition, r.Offset})
	}
	f.mu.Unlock()
	return nil
}

// kgoProducer is a Producer on a kgohooks.Client.
type kgoProducer struct{ cl *kgohooks.Client }

func (p kgoProducer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	rs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		rs[i] = r
	}
	return p.cl.ProduceSync(ctx, rs...).FirstErr()
}

func toKafka(r *kgo.Record) kafka.Message {
	m := kafka.Message{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Timestamp}
	for _, h := range r.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	return m
}

// kgoOpts are the franz-go options of the pipeline's consumer and producer.
func kgoOpts(c config) (in, out []kgo.Opt) {
	// FetchMaxWait as the kafka-go consumer's MaxWait: kgo sends one fetch
	// to a broker at a time, and a member that has just joined may send its
	// first with only some of its partitions ready (their offsets still
	// being validated); the others, the one whose record woke it among
	// them, wait for that fetch's long poll to end (5 s by default).
	in = []kgo.Opt{kgo.SeedBrokers(c.brokers...), kgo.ClientID(c.clientID), kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(c.in), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250 * time.Millisecond)}
	if c.balancer == "server" {
		in = append(in, kgo.ServerSideBalancer())
	}
	out = []kgo.Opt{kgo.SeedBrokers(c.brokers...), kgo.ClientID(c.clientID), kgo.DefaultProduceTopic(c.out),
		kgo.ProducerLinger(0)}
	if c.kgoDebug {
		// Timestamped, to line kgo's requests up with the broker's log.
		lg := kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, func() string { return time.Now().UTC().Format("15:04:05.000000 ") }))
		in, out = append(in, lg), append(out, lg)
	}
	sec, _ := c.sec.kgo() // its only error, a bad CA file, stopped main
	return append(in, sec...), append(out, sec...)
}
