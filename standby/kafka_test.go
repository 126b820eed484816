package standby

import (
	"context"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/standby/kafkastandby"
)

// kafkaWake wires package kafkastandby into the tests' supervisors, as
// cmd/kcr wires it into kcr standby's (Options.KafkaWake).
func kafkaWake(ctx context.Context, o *Options, saveHold func(member, protocol string) error) (KafkaParts, error) {
	w, err := kafkastandby.Open(ctx, kafkastandby.Config{
		Brokers: o.Brokers, Group: o.Group, Topics: o.Topics, ShareGroup: o.ShareGroup,
		Poll: o.Poll, BrokerTimeout: o.BrokerTimeout, NoHoldGroup: o.NoHoldGroup, Kafka: kafkastandby.Security(o.Kafka),
		Replicas: o.Replicas, ReplicasTopic: o.ReplicasTopic, ReplicasKeyFile: o.ReplicasKeyFile,
		MinWake: o.MinWake, ScaleUpAfter: o.ScaleUpAfter,
		ImageDir: o.ImageDir, Version: engine.Version, Logger: o.Logger, Observer: o.Observer, SaveHold: saveHold,
	})
	if err != nil || w == nil {
		return KafkaParts{}, err
	}
	p := KafkaParts{Source: w.Source}
	if w.Hold != nil {
		p.Keeper = w.Hold
	}
	if w.Replica != nil {
		p.Replica = replicaStatus{w.Replica}
	}
	return p, nil
}

type replicaStatus struct{ *kafkastandby.Replica }

func (r replicaStatus) Status() ReplicaStatus { return ReplicaStatus(r.Replica.Status()) }
