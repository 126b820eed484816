package kafkastandby

import (
	"context"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// blindWhy begins the reason a Kafka wake gives not to sleep when nothing
// could wake the service from Kafka (the group has no offsets on its
// topics yet): it holds for a replica too, however many others run.
const blindWhy = "nothing could wake the service from Kafka: "

// replicaGroup is the group a replica (Config.Replicas) reads to decide:
// its Kafka wake, live members and backlog. A consumer group (kafkaSource,
// --group) or a share group (shareSource, --share-group).
type replicaGroup interface {
	Source
	// groupID names the group: the key of its claims.
	groupID() string
	// members counts the group's live members, kcr's placeholders left
	// out; stable is false while the last one to join has no work yet.
	members(ctx context.Context) (n int, stable bool, err error)
	// backlog is the group's unprocessed work and its oldest record.
	backlog(ctx context.Context) (kafkawake.Backlog, error)
}

func (k *kafkaSource) groupID() string { return k.w.Group() }

func (k *kafkaSource) members(ctx context.Context) (int, bool, error) {
	return k.w.Members(ctx, func(clientID string) bool { return clientID == holdClientID })
}

func (k *kafkaSource) backlog(ctx context.Context) (kafkawake.Backlog, error) {
	return k.w.Backlog(ctx)
}

// A share group has no placeholders: every member is a consumer.
func (k *shareSource) groupID() string { return k.w.Group() }

func (k *shareSource) members(ctx context.Context) (int, bool, error) {
	return k.w.Members(ctx, nil)
}

func (k *shareSource) backlog(ctx context.Context) (kafkawake.Backlog, error) {
	return k.w.Backlog(ctx)
}
