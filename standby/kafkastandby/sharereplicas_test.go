package kafkastandby

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// shareReplica is one replica's Kafka wake on share group g of topic
// (one partition), as its kcr standby --share-group --replicas has it.
func shareReplica(t *testing.T, addrs []string, g, topic, name string, scaleUp time.Duration) *Replica {
	t.Helper()
	o := testConfig(t, addrs)
	o.ImageDir = filepath.Join(t.TempDir(), name)
	o.ShareGroup, o.Topics, o.Replicas, o.ReplicasTopic, o.ScaleUpAfter = g, []string{topic}, true, "claims", scaleUp
	sh, err := newShareSource(t.Context(), &o)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := newReplica(t.Context(), &o, sh)
	if err != nil {
		sh.Close()
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	return rs
}

// shareHolder joins share group g and acquires records of topic without
// ever acknowledging them: a live member that does not keep up.
func shareHolder(t *testing.T, addrs []string, g, topic string) {
	t.Helper()
	m, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ShareGroup(g), kgo.ConsumeTopics(topic), kgo.ShareMaxRecords(1), kgo.ShareMaxRecordsStrict())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil && m.PollFetches(ctx).NumRecords() == 0 {
	}
}

// Replicas of a share-group service: with no member, the first records
// wake one replica (its claim wins) and another sees the claim and stays
// asleep; with one live member holding records it does not acknowledge,
// the share backlog's oldest record ages past --scale-up-after and a
// sleeping replica scales up, on a one-partition topic. The members are
// the share group's, and no placeholder is counted.
func TestShareReplicas(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "sz", "su"))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for _, g := range []string{"z", "u"} {
		c.SetGroupConfigs(g, map[string]string{"share.auto.offset.reset": "earliest"})
		kafkatest.Produce(t, addrs, "s"+g, 1)
		kafkatest.ShareAccept(t, addrs, g, "s"+g, 1) // the group's offsets
	}

	a, b := shareReplica(t, addrs, "z", "sz", "a", 10*time.Second), shareReplica(t, addrs, "z", "sz", "b", 10*time.Second)
	kafkatest.Produce(t, addrs, "sz", 2)
	won, err := a.fromZero(ctx, 0)
	wantDecision(t, a, won, err, true, DecisionWokenByLag)
	if err := b.claims.ReadTo(t.Context(), lastClaim(t, a)); err != nil {
		t.Fatal(err)
	}
	won, err = b.fromZero(ctx, 0)
	wantDecision(t, b, won, err, false, DecisionWaitingForOther)

	x, y := shareReplica(t, addrs, "u", "su", "x", 500*time.Millisecond), shareReplica(t, addrs, "u", "su", "y", 500*time.Millisecond)
	kafkatest.Produce(t, addrs, "su", 3)
	shareHolder(t, addrs, "u", "su")
	var live int
	deadline := time.Now().Add(20 * time.Second)
	for live != 1 && time.Now().Before(deadline) {
		live = settle(t, x)
	}
	if live != 1 {
		t.Fatalf("%d live members of the share group, want 1", live)
	}
	won, err = x.scaleUp(ctx, live)
	for !won && err == nil && time.Now().Before(deadline) {
		won, err = x.scaleUp(ctx, live)
	}
	wantDecision(t, x, won, err, true, DecisionScaledUp)
	if st := x.Status(); st.Lag < 1 || st.OldestAgeMS < 500 {
		t.Errorf("status %+v: want a backlog whose oldest record waited past --scale-up-after", st)
	}
	settle(t, y)
	if err := y.claims.ReadTo(t.Context(), lastClaim(t, x)); err != nil {
		t.Fatal(err)
	}
	won, err = y.scaleUp(ctx, live)
	wantDecision(t, y, won, err, false, DecisionWaitingForOther)
}
