package e2e

// franz-go end-to-end cases of docs/franz-go-options.md's rules
// (BlockRebalanceOnPoll, a group at AtEnd, group offsets gone): kgoapp's
// group consumer (-consume, kgohooks.Client) checkpointed and restored by
// kcr on real CRIU against the real broker. KGOAPP_CONSUME_OPTS varies its kgo
// options (see kgoapp/consume.go).

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestKgoConsumerGroup with kgo.BlockRebalanceOnPoll: the checkpointed
// member leaves the group (the other takes its partitions within seconds),
// nothing is lost, no committed offset goes back, and the restored member
// rejoins.
func TestKgoConsumerGroupBlockRebalance(t *testing.T) {
	t.Setenv("KGOAPP_CONSUME_OPTS", "block-rebalance")
	testConsumerGroup(t, kgoBin, func(string) string { return "kgo/member-a" })
}

// producePartition writes n records to one partition of topic with the
// test's own client.
func (k *kafkaEnv) producePartition(topic string, part int32, n int) {
	t := k.t
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < n; i++ {
		v := []byte(strconv.Itoa(i))
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: v, Partition: part}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// consumerAlone starts kgoapp's group consumer as the only member of a new
// group on a new topic of 3 partitions and waits until it holds them all.
func (k *kafkaEnv) consumerAlone(prefix string) (a *kapp, topic, group string) {
	topic = k.newTopic(prefix, 3)
	group = uniqueName(prefix)
	a = k.startBin(kgoBin, "-topic", topic, "-group", group, "-consume", "-client-id", "solo")
	k.waitGroup(group, topic, 60*time.Second, "the member holding the 3 partitions", func(v groupView) bool {
		return v.state == "Stable" && len(v.assigned["solo"]) == 3
	})
	return a, topic, group
}

// A group member at AtEnd that polled from partition 0 only is
// checkpointed; the records produced meanwhile to partitions 1 and 2, which
// it never polled from, are processed after the restore (the checkpoint
// pinned where it had started them).
func TestKgoGroupAtEndKeepsDowntime(t *testing.T) {
	t.Setenv("KGOAPP_CONSUME_OPTS", "reset-end")
	k := needKafka(t)
	a, topic, group := k.consumerAlone("kgoend")
	// Once a record of partition 0 is processed, the member has resolved
	// its start offsets (AtEnd: records produced before are not read).
	eventually(t, 30*time.Second, "a record of partition 0 processed", func() (bool, string) {
		k.producePartition(topic, 0, 1)
		time.Sleep(300 * time.Millisecond)
		return len(processed(a.events())) > 0, ""
	})
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	rep := kgoReport(t, manifestResource(t, img, "kgo/solo"))
	t.Logf("reader report in the manifest: %+v", rep.GroupCheckpoint)
	if rep.GroupCheckpoint == nil || !rep.LeftGroup || rep.PartitionsPinned < 2 {
		t.Errorf("reader report %+v: want left_group, partitions_pinned >= 2 (partitions 1 and 2 had no commit)", rep.GroupCheckpoint)
	}
	if c, err := k.committed(group, topic); err != nil || c[1] != 0 || c[2] != 0 {
		t.Errorf("committed offsets after the checkpoint %v (%v): want partitions 1 and 2 pinned at 0", c, err)
	}
	k.producePartition(topic, 1, 5)
	k.producePartition(topic, 2, 5)
	na := len(a.events())
	pid, _ := restore(t, img)
	defer a.stop(pid)
	eventually(t, 60*time.Second, "the records produced to partitions 1 and 2 during the checkpoint processed", func() (bool, string) {
		got := processed(a.since(na))
		var miss []string
		for _, p := range []int32{1, 2} {
			for o := int64(0); o < 5; o++ {
				if got[po{p, o}] == 0 {
					miss = append(miss, fmt.Sprintf("%d/%d", p, o))
				}
			}
		}
		return len(miss) == 0, fmt.Sprintf("missing %v", miss)
	})
}

// The group's committed offsets are gone when the member is restored:
// offsets.retention.minutes expires the offsets of an empty group, and the
// checkpoint emptied it; the test deletes the group while the member is
// checkpointed, which is what expiry does. The restored member continues
// from the offsets the image recorded (not from ConsumeResetOffset AtStart,
// which would process everything again), and logs it.
func TestKgoGroupOffsetsGoneAtRestore(t *testing.T) {
	k := needKafka(t)
	a, topic, group := k.consumerAlone("kgoexp")
	for p := int32(0); p < 3; p++ {
		k.producePartition(topic, p, 10)
	}
	k.waitCommitted(group, topic, map[int32]int64{0: 10, 1: 10, 2: 10}, 60*time.Second)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	rep := kgoReport(t, manifestResource(t, img, "kgo/solo"))
	if rep.GroupCheckpoint == nil || rep.OffsetsRecorded != 3 {
		t.Errorf("reader report %+v: want offsets_recorded 3", rep.GroupCheckpoint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := k.adm.DeleteGroup(ctx, group); err != nil {
		t.Fatalf("delete group %s: %v", group, err)
	}
	if c, err := k.committed(group, topic); err != nil || len(c) != 0 {
		t.Fatalf("committed offsets after deleting the group: %v (%v), want none", c, err)
	}
	for p := int32(0); p < 3; p++ {
		k.producePartition(topic, p, 3)
	}
	na := len(a.events())
	pid, _ := restore(t, img)
	defer a.stop(pid)
	k.waitCommitted(group, topic, map[int32]int64{0: 13, 1: 13, 2: 13}, 60*time.Second)
	got := processed(a.since(na))
	var again []po
	for x := range got {
		if x.o < 10 {
			again = append(again, x)
		}
	}
	if len(again) > 0 || len(got) != 9 {
		t.Errorf("after the restore processed %d records, %d of them processed before the checkpoint (e.g. %v): want the 9 new ones only", len(got), len(again), again[:min(5, len(again))])
	}
	logged := false
	for _, e := range a.since(na) {
		if e["ev"] == "log" && strings.Contains(fmt.Sprint(e["msg"]), "continuing from the recorded offsets") {
			logged = true
		}
	}
	if !logged {
		t.Errorf("the restored member did not log that it continued from the recorded offsets: %v", tail(a.since(na), 10))
	}
}
