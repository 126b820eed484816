package kgohooks_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkaconform"
	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
)

// TestConformance runs the promises every Kafka client wrapper keeps
// (internal/testkit/kafkaconform) against kgohooks' Client.
func TestConformance(t *testing.T) { kafkaconform.Run(t, franzGo{}) }

// franzGo is kgohooks' adapter to the suite: one Client producing, one
// consuming as a member of a classic group with kgo's default commits
// (kgohooks commits what was handed out at the checkpoint).
type franzGo struct{}

func (franzGo) Caps() kafkaconform.Caps {
	return kafkaconform.Caps{KeepsMemberOnLeaveRunning: true, Idempotent: true}
}

func (franzGo) Producer(t testing.TB, addrs []string, reg *notify.Registry, topic, clientID string) kafkaconform.Producer {
	return client{newClient(t, reg, kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic), kgo.ClientID(clientID))}
}

func (franzGo) Consumer(t testing.TB, addrs []string, reg *notify.Registry, group, topic, clientID string) kafkaconform.Consumer {
	return client{newClient(t, reg, kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond), kgo.ClientID(clientID))}
}

func newClient(t testing.TB, reg *notify.Registry, opts ...kgo.Opt) *kgohooks.Client {
	c, err := kgohooks.New(opts, kgohooks.WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type client struct{ c *kgohooks.Client }

func (c client) Send(ctx context.Context, values ...string) error {
	rs := make([]*kgo.Record, len(values))
	for i, v := range values {
		rs[i] = &kgo.Record{Value: []byte(v)}
	}
	return c.c.ProduceSync(ctx, rs...).FirstErr()
}

func (c client) SendAsync(ctx context.Context, done func(error), values ...string) error {
	for _, v := range values {
		c.c.Produce(ctx, &kgo.Record{Value: []byte(v)}, func(_ *kgo.Record, err error) { done(err) })
	}
	return nil
}

func (c client) Next(ctx context.Context, n int) ([]string, error) {
	for {
		fs := c.c.PollRecords(ctx, n)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return nil, errs[0].Err
		}
		var out []string
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
		if len(out) > 0 {
			return out, nil
		}
	}
}

func (c client) ClientID() string { return c.c.ClientID() }

// TestShareConformance runs the suite's promises about the consumer
// against kgohooks' ShareConsumer, with the Client producing.
func TestShareConformance(t *testing.T) { kafkaconform.Run(t, franzGoShare{}) }

// franzGoShare is the ShareConsumer's adapter to the suite: a member of a
// share group that accepts each record it hands out. A checkpoint always
// leaves the share group, --leave-running included; nothing it acquired is
// in the image.
type franzGoShare struct{ franzGo }

func (franzGoShare) Caps() kafkaconform.Caps {
	return kafkaconform.Caps{Idempotent: true, ShareGroup: true}
}

func (franzGoShare) Consumer(t testing.TB, addrs []string, reg *notify.Registry, group, topic, clientID string) kafkaconform.Consumer {
	c, err := kgohooks.NewShareConsumer([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ShareGroup(group), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(100 * time.Millisecond), kgo.ClientID(clientID)}, kgohooks.WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return shareConsumer{c}
}

type shareConsumer struct{ c *kgohooks.ShareConsumer }

func (c shareConsumer) Next(ctx context.Context, n int) ([]string, error) {
	for {
		fs := c.c.PollRecords(ctx, n)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return nil, errs[0].Err
		}
		var out []string
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, string(r.Value))
			r.Ack(kgo.AckAccept)
		})
		if len(out) > 0 {
			return out, nil
		}
	}
}

func (c shareConsumer) ClientID() string { return c.c.ClientID() }
