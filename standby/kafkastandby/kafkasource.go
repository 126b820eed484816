package kafkastandby

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// kafkaSource is the Kafka wake of a consumer group (Config.Group): records
// past the group's commits.
type kafkaSource struct{ w *kafkawake.Watcher }

func newKafkaSource(ctx context.Context, o *Config) (*kafkaSource, error) {
	w, err := kafkawake.New(ctx, kafkawake.Config{Brokers: o.Brokers, Group: o.Group, Topics: o.Topics, Poll: o.Poll,
		BrokerTimeout: o.BrokerTimeout, Logger: o.Logger, Requests: o.Observer.BrokerRequests, Opts: o.kafkaOpts})
	if errors.Is(err, kafkawake.ErrConfig) {
		return nil, fmt.Errorf("%w: %v", ErrBadOption, err)
	}
	if err != nil {
		return nil, err
	}
	return &kafkaSource{w}, nil
}

func (k *kafkaSource) Name() string { return "kafka" }

func (k *kafkaSource) AbandonsCheckpoint() bool { return true }

func (k *kafkaSource) Busy(ctx context.Context) (string, error) {
	n, topics, err := k.w.Pending(ctx)
	switch {
	case errors.Is(err, kafkawake.ErrNoTopics):
		return blindWhy + err.Error(), nil
	case err != nil:
		return "", err
	case n > 0:
		return fmt.Sprintf("%d records wait on %v", n, topics), nil
	}
	return "", nil
}

func (k *kafkaSource) Wait(ctx context.Context) error { return k.w.Wait(ctx) }

func (k *kafkaSource) SaveState() (json.RawMessage, error) { return json.Marshal(k.w.State()) }

func (k *kafkaSource) LoadState(b json.RawMessage) error {
	var st kafkawake.State
	if err := json.Unmarshal(b, &st); err != nil {
		return err
	}
	k.w.SetState(st)
	return nil
}

func (k *kafkaSource) Close() { k.w.Close() }
