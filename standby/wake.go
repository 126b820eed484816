package standby

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// WakeSource finds the work that wakes the sleeping service (besides a
// manual wake): the Kafka wake (kafkaSource, shareSource, replicaSource),
// a connection on --listen (listenSource).
type WakeSource interface {
	// Name is the source's name: the "source" of its wakes, and its key
	// in the state file.
	Name() string
	// Busy is asked before a checkpoint: why the service must not sleep
	// now ("": it may). An error means unknown, and the checkpoint goes
	// on: the wait wakes the service on any work.
	Busy(ctx context.Context) (why string, err error)
	// Wait returns nil once work arrived, or ctx.Err() when ctx ended; the
	// source's own errors never end it.
	Wait(ctx context.Context) error
	// AbandonsCheckpoint reports whether its work abandons a checkpoint
	// under way (abandon.go). Not a source whose wait acts (the replicas'
	// claim is not for a copy that may run on), nor one whose work waits
	// for the restored copy anyway (a connection in --listen's backlog).
	AbandonsCheckpoint() bool
	// SaveState and LoadState carry what the source needs across restarts
	// of kcr standby, in the state file (nil: nothing).
	SaveState() (json.RawMessage, error)
	LoadState(json.RawMessage) error
	Close()
}

// GroupKeeper keeps the service's consumer group from being empty while
// the service sleeps, so that its wake does not wait out the broker's
// initial rebalance delay (the group hold, groupHold). The supervisor
// tells it where the cycle is; it records its placeholder in the state
// file through the save function it was built with.
type GroupKeeper interface {
	// Load takes what an earlier kcr standby recorded in the state file,
	// before any other call.
	Load(member, protocol string)
	// Sweep removes the placeholder member an earlier kcr standby left;
	// LeaveLater retries that until the member's session ends.
	Sweep(member string) error
	LeaveLater(member string)
	// Arm holds the group before the checkpoint, while the service's
	// member is in it; Asleep says the checkpoint is done.
	Arm(ctx context.Context)
	Asleep(ctx context.Context)
	// Woken says the service is being restored; ReleaseOthers, run
	// beside it, removes placeholders left in the group by others.
	Woken()
	ReleaseOthers(ctx context.Context)
	// Stop ends the hold (its placeholder leaves); Close also frees its
	// client.
	Stop()
	Close()
}

// Replica is a replica's wake among several (Options.Replicas): what it
// decided, for Status, and the service's runs it did not decide.
type Replica interface {
	Status() ReplicaStatus
	// Started says the service runs for another reason than this
	// replica's claim: started cold, or woken by source by (another
	// source than the replica's own).
	Started(by, why string)
}

// kafkaSource is the Kafka wake: records past the commits of the service's
// consumer group.
type kafkaSource struct{ w *kafkawake.Watcher }

func newKafkaSource(ctx context.Context, o *Options) (*kafkaSource, error) {
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
