package main

import (
	"context"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/standby"
	"github.com/kcr-dev/kcr/standby/kafkastandby"
)

// kafkaWake is kcr standby's Options.KafkaWake: package kafkastandby's
// wake source, replica and group hold, wired into the supervisor, which
// knows no Kafka.
func kafkaWake(ctx context.Context, o *standby.Options, saveHold func(member, protocol string) error) (standby.KafkaParts, error) {
	w, err := kafkastandby.Open(ctx, kafkastandby.Config{
		Brokers: o.Brokers, Group: o.Group, Topics: o.Topics, ShareGroup: o.ShareGroup,
		Poll: o.Poll, BrokerTimeout: o.BrokerTimeout, NoHoldGroup: o.NoHoldGroup, Kafka: kafkastandby.Security(o.Kafka),
		Replicas: o.Replicas, ReplicasTopic: o.ReplicasTopic, ReplicasKeyFile: o.ReplicasKeyFile,
		MinWake: o.MinWake, ScaleUpAfter: o.ScaleUpAfter,
		ImageDir: o.ImageDir, Version: engine.Version, Logger: o.Logger, Observer: o.Observer, SaveHold: saveHold,
	})
	if err != nil || w == nil {
		return standby.KafkaParts{}, err
	}
	p := standby.KafkaParts{Source: w.Source}
	if w.Hold != nil {
		p.Keeper = w.Hold
	}
	if w.Replica != nil {
		p.Replica = replicaStatus{w.Replica}
	}
	return p, nil
}

// replicaStatus gives a kafkastandby replica's status as standby's.
type replicaStatus struct{ *kafkastandby.Replica }

func (r replicaStatus) Status() standby.ReplicaStatus {
	return standby.ReplicaStatus(r.Replica.Status())
}
