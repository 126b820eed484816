package kafkastandby

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// shareSource is the Kafka wake of a share-group service (Config.ShareGroup):
// the share group's backlog, records no member has acknowledged. No group
// hold goes with it: a share group has no rebalance to wait for.
type shareSource struct{ w *kafkawake.ShareWatcher }

// newShareSource opens the wake of the share group (Config.ShareGroup).
func newShareSource(ctx context.Context, o *Config) (*shareSource, error) {
	w, err := kafkawake.NewShare(ctx, kafkawake.ShareConfig{Brokers: o.Brokers, Group: o.ShareGroup, Topics: o.Topics, Poll: o.Poll,
		BrokerTimeout: o.BrokerTimeout, Logger: o.Logger, Requests: o.Observer.BrokerRequests, Opts: o.kafkaOpts})
	if errors.Is(err, kafkawake.ErrConfig) {
		return nil, fmt.Errorf("%w: %v", ErrBadOption, err)
	}
	if err != nil {
		return nil, err
	}
	return &shareSource{w}, nil
}

func (k *shareSource) Name() string { return "kafka" }

func (k *shareSource) AbandonsCheckpoint() bool { return true }

func (k *shareSource) Busy(ctx context.Context) (string, error) {
	n, topics, err := k.w.Pending(ctx)
	switch {
	case errors.Is(err, kafkawake.ErrNoShareOffsets):
		return blindWhy + err.Error(), nil
	case err != nil:
		return "", err
	case n > 0:
		return fmt.Sprintf("%d records of share group %s wait on %v", n, k.w.Group(), topics), nil
	}
	return "", nil
}

func (k *shareSource) Wait(ctx context.Context) error { return k.w.Wait(ctx) }

// The broker keeps the share group's state: nothing to carry.
func (k *shareSource) SaveState() (json.RawMessage, error) { return nil, nil }
func (k *shareSource) LoadState(json.RawMessage) error     { return nil }

func (k *shareSource) Close() { k.w.Close() }
