package standby

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// shareSource is the Kafka wake of a share-group service (Options.ShareGroup):
// the share group's backlog, records no member has acknowledged. No group
// hold goes with it: a share group has no rebalance to wait for.
type shareSource struct{ w *kafkawake.ShareWatcher }

// addShareWake adds the share group's wake (Options.ShareGroup), through a
// replica's decisions with Options.Replicas.
func (s *Supervisor) addShareWake(ctx context.Context) error {
	sh, err := newShareSource(ctx, &s.o)
	if err != nil {
		return err
	}
	if !s.o.Replicas {
		s.wakes = append(s.wakes, sh)
		return nil
	}
	replica, err := newReplicaSource(ctx, &s.o, sh, engine.Version)
	if err != nil {
		sh.Close()
		return err
	}
	s.wakes, s.replica = append(s.wakes, replica), replica
	return nil
}

func newShareSource(ctx context.Context, o *Options) (*shareSource, error) {
	var err error
	if o.kafkaOpts, err = o.Kafka.kgoOpts(o.Logger); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadOption, err)
	}
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
