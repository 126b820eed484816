package kafkahooks_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/testkit/kafkaconform"
	"github.com/kcr-dev/kcr/kafkahooks"
	"github.com/kcr-dev/kcr/notify"
)

// TestConformance runs the promises every Kafka client wrapper keeps
// (internal/testkit/kafkaconform) against kafka-go's Writer and Reader.
func TestConformance(t *testing.T) { kafkaconform.Run(t, kafkaGo{}) }

// kafkaGo is kafkahooks' adapter to the suite: an async Writer (so that a
// record can wait unacknowledged) and a group Reader that commits each
// record once it is processed.
type kafkaGo struct{}

// kafka-go's Reader closes its connections by closing the kafka.Reader,
// which leaves the group, so it cannot keep its member; kafka-go has no
// idempotent producer, so a produce request cut by the checkpoint may be
// on the topic as well as resent.
func (kafkaGo) Caps() kafkaconform.Caps { return kafkaconform.Caps{} }

func (kafkaGo) Producer(t testing.TB, addrs []string, reg *notify.Registry, topic, clientID string) kafkaconform.Producer {
	p := &writer{done: map[string]func(error){}}
	tmpl := &kafka.Writer{
		Addr: kafka.TCP(addrs...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchSize: 10, BatchTimeout: time.Millisecond, Async: true, Completion: p.complete,
		WriteBackoffMin: 10 * time.Millisecond, WriteBackoffMax: 50 * time.Millisecond,
		WriteTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
	}
	p.w = kafkahooks.NewWriter(tmpl, kafkahooks.WithRegistry(reg), kafkahooks.WithClientID(clientID),
		kafkahooks.WithRetryBackoff(10*time.Millisecond, 100*time.Millisecond))
	t.Cleanup(func() { p.w.Close() })
	return p
}

type writer struct {
	w    *kafkahooks.Writer
	mu   sync.Mutex
	done map[string]func(error) // record value → its acknowledgement
}

func (p *writer) complete(msgs []kafka.Message, err error) {
	for _, m := range msgs {
		p.mu.Lock()
		f := p.done[string(m.Value)]
		delete(p.done, string(m.Value))
		p.mu.Unlock()
		if f != nil {
			f(err)
		}
	}
}

func (p *writer) SendAsync(ctx context.Context, done func(error), values ...string) error {
	msgs := make([]kafka.Message, len(values))
	p.mu.Lock()
	for i, v := range values {
		p.done[v] = done
		msgs[i] = kafka.Message{Value: []byte(v)}
	}
	p.mu.Unlock()
	return p.w.WriteMessages(ctx, msgs...)
}

func (p *writer) Send(ctx context.Context, values ...string) error {
	acks := make(chan error, len(values))
	if err := p.SendAsync(ctx, func(err error) { acks <- err }, values...); err != nil {
		return err
	}
	for range values {
		select {
		case err := <-acks:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (p *writer) ClientID() string { return p.w.ClientID() }

func (kafkaGo) Consumer(t testing.TB, addrs []string, reg *notify.Registry, group, topic, clientID string) kafkaconform.Consumer {
	r := kafkahooks.NewReader(kafka.ReaderConfig{
		Brokers: addrs, GroupID: group, Topic: topic,
		Dialer:            &kafka.Dialer{ClientID: clientID, Timeout: 10 * time.Second},
		StartOffset:       kafka.FirstOffset,
		HeartbeatInterval: 100 * time.Millisecond,
		// Long: a member that did not leave the group would stay listed.
		SessionTimeout:   30 * time.Second,
		RebalanceTimeout: 2 * time.Second,
		JoinGroupBackoff: 50 * time.Millisecond,
		MaxWait:          100 * time.Millisecond,
		ReadBackoffMin:   10 * time.Millisecond,
		ReadBackoffMax:   50 * time.Millisecond,
		MaxAttempts:      10,
	}, kafkahooks.WithRegistry(reg))
	t.Cleanup(func() { r.Close() })
	return reader{r}
}

type reader struct{ r *kafkahooks.Reader }

func (c reader) Next(ctx context.Context, n int) ([]string, error) {
	m, err := c.r.FetchMessage(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.r.CommitMessages(ctx, m); err != nil {
		return nil, err
	}
	return []string{string(m.Value)}, nil
}

func (c reader) ClientID() string { return c.r.ClientID() }
