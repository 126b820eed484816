// Package kafkastandby is kcr standby's Kafka: the wake source of a
// service's consumer group or share group (records past the group's
// commits, package kafkawake), the replicas' decisions and claims
// (--replicas), the group hold that keeps a classic group from being empty
// while the service sleeps, and the TLS and SASL of these clients.
//
// It imports nothing of package standby: its Wake's parts have the method
// sets of standby's WakeSource, GroupKeeper and Replica, and cmd/kcr wires
// them into the supervisor (standby.Options.KafkaWake).
package kafkastandby

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrBadOption is wrapped by the errors of bad options (a broker address
// kgo refuses, a missing key file): standby takes an error whose chain has
// a BadOption method for its own ErrBadOption, of the same words.
var ErrBadOption error = optionError("bad standby option")

type optionError string

func (e optionError) Error() string { return string(e) }

// BadOption marks the error as a bad option for standby.
func (optionError) BadOption() bool { return true }

// Config is the Kafka part of kcr standby's options, checked by standby
// (Options.check) and given their defaults there: each field is
// standby.Options' of the same name.
type Config struct {
	Brokers       []string
	Group         string
	Topics        []string
	ShareGroup    string
	Poll          time.Duration
	BrokerTimeout time.Duration
	NoHoldGroup   bool
	Kafka         Security

	Replicas        bool
	ReplicasTopic   string
	ReplicasKeyFile string
	MinWake         int
	ScaleUpAfter    time.Duration

	// ImageDir names this replica in the claims (replicaID).
	ImageDir string
	// Version is kcr's, in this replica's claims.
	Version string
	Logger  *slog.Logger
	// Observer is told the broker requests and the holds' results (and,
	// if it implements ReplicaObserver, the replica's decisions).
	Observer Observer
	// SaveHold records the hold's placeholder and protocol in the state
	// file: a kcr standby killed meanwhile left the placeholder in the
	// group, and the next one removes it (Hold.Load, Hold.Sweep).
	SaveHold func(member, protocol string) error

	// kafkaOpts are Kafka's kgo options, from Kafka (Open).
	kafkaOpts []kgo.Opt
}

// Observer is told what the Kafka clients do, for metrics: standby's
// Observer has these methods.
type Observer interface {
	BrokerRequests(n int)
	// GroupHold is told how a group hold went: HoldHeld, HoldSkipped,
	// HoldReleased or HoldFailed.
	GroupHold(result string)
}

// ReplicaObserver, if the Observer implements it, is told every change of
// a replica's decision.
type ReplicaObserver interface {
	ReplicaDecision(decision string)
}

// Source is a Kafka wake source: standby's WakeSource.
type Source interface {
	Name() string
	Busy(ctx context.Context) (why string, err error)
	Wait(ctx context.Context) error
	AbandonsCheckpoint() bool
	SaveState() (json.RawMessage, error)
	LoadState(json.RawMessage) error
	Close()
}

// Wake is the Kafka wake of one kcr standby.
type Wake struct {
	// Source is the group's wake source, through the replica's claims
	// with Replicas.
	Source Source
	// Hold is the group hold of a consumer group (Group); nil for a
	// share group, which has no rebalance to wait for.
	Hold *Hold
	// Replica is the wake among replicas (Replicas; also Source); nil
	// without.
	Replica *Replica
}

// Open opens the Kafka wake of cfg's Group or ShareGroup: it checks that
// the broker answers (bounded by BrokerTimeout). Neither: nil, nil.
func Open(ctx context.Context, cfg Config) (*Wake, error) {
	if cfg.Group == "" && cfg.ShareGroup == "" {
		return nil, nil
	}
	var err error
	if cfg.kafkaOpts, err = cfg.Kafka.kgoOpts(cfg.Logger); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadOption, err)
	}
	c := &cfg
	var g replicaGroup
	if c.Group != "" {
		g, err = newKafkaSource(ctx, c)
	} else {
		g, err = newShareSource(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	w := &Wake{Source: g}
	if c.Replicas {
		if w.Replica, err = newReplica(ctx, c, g); err != nil {
			g.Close()
			return nil, err
		}
		w.Source = w.Replica
	}
	if c.Group == "" {
		return w, nil
	}
	if w.Hold, err = newHold(c); err != nil {
		w.Source.Close()
		return nil, err
	}
	if w.Replica != nil {
		w.Hold.groupIdle = w.Replica.idle.Load
	}
	return w, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
