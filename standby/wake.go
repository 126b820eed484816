package standby

import (
	"context"
	"encoding/json"
	"time"
)

// WakeSource finds the work that wakes the sleeping service (besides a
// manual wake): a connection on --listen (listenSource), the Kafka wake
// (package kafkastandby, through Options.KafkaWake).
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
// initial rebalance delay (the group hold: kafkastandby.Hold). The supervisor
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

// KafkaParts is what Options.KafkaWake opens; a nil field is none.
type KafkaParts struct {
	Source  WakeSource
	Keeper  GroupKeeper
	Replica Replica
}

// Replica is a replica's wake among several (Options.Replicas): what it
// decided, for Status, and the service's runs it did not decide.
type Replica interface {
	Status() ReplicaStatus
	// Started says the service runs for another reason than this
	// replica's claim: started cold, or woken by source by (another
	// source than the replica's own).
	Started(by, why string)
	// Gone says the service will not join the group for this replica's
	// claims (it exited), so that the other replicas need not wait for
	// them.
	Gone(why string)
}

// ReplicaStatus is a replica's last decision, in Status.
type ReplicaStatus struct {
	ID       string    `json:"id"`
	Decision string    `json:"decision"`
	Why      string    `json:"why"`
	At       time.Time `json:"at"`
	// What the decision saw: the group's live members (placeholders
	// left out), its lag, and the age of its oldest unprocessed record.
	Live        int     `json:"live_members"`
	Lag         int64   `json:"lag"`
	OldestAgeMS float64 `json:"oldest_age_ms"`
}

// ReplicaObserver, if the Observer implements it, is told every change of
// a replica's decision (kafkastandby's Decision constants).
type ReplicaObserver interface {
	ReplicaDecision(decision string)
}
