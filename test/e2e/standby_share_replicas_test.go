package e2e

// kcr standby --share-group --replicas: three replicas of a share consumer
// (kgoapp -share) on a one-partition topic, on the broker with Kafka's
// production group settings.

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// shareReplicaScaleUp is the share replicas' --scale-up-after.
const shareReplicaScaleUp = 3 * time.Second

// Three replicas under kcr standby --share-group --replicas, on a topic of
// one partition: idle, all sleep, with no group hold; a burst wakes
// exactly one; a sustained load at 2.5× one replica's capacity wakes the
// other two, one at a time, all three processing records of the one
// partition at once; when it stops, all sleep. An independent reader
// finds no record missing, and a record processed more than once was
// delivered again after a release (each processing has its own delivery
// count: a checkpoint released it, docs/share-groups.md).
func TestStandbyShareReplicas(t *testing.T) {
	k := needKafkaProd(t)
	topic, group := k.newTopic("sbsharerep", 1), uniqueName("sbsharerep")
	k.shareEarliest(group)
	flags := []string{"--idle", "2s", "--share-group", group, "--topics", topic, "--replicas",
		"--replicas-topic", uniqueName("kcr-claims"), "--scale-up-after", shareReplicaScaleUp.String()}
	// 50 records/s each, 10 records (200 ms) a poll.
	svc := []string{kgoBin, "-brokers", k.brokers, "-topic", topic, "-group", group, "-share", "-share-max", "10", "-proc-delay", "20ms", "-client-id", "sbsharerep"}
	var runs []*sbRun
	for i := range 3 {
		runs = append(runs, k.startStandby(filepath.Join(t.TempDir(), fmt.Sprintf("replica%d", i)), flags, svc...))
	}
	r := &replicaRig{t: t, k: k, topic: topic, group: group, runs: runs}
	t.Cleanup(func() {
		if t.Failed() {
			r.timeline()
		}
	})
	r.allAsleep("idle")

	// One burst: one replica wakes, the others stay asleep.
	k.produceN(topic, 20)
	r.waitProcessed(60 * time.Second)
	if w := r.kafkaWakes(); sum(w) != 1 {
		t.Errorf("a burst to the sleeping replicas woke %v (by replica), want exactly one", w)
	}
	r.allAsleep("after the burst")

	// Sustained overload: all three run, woken one at a time, and all
	// three process records of the one partition.
	loadAt := time.Now()
	before := make([]int, len(runs))
	for i, s := range runs {
		before[i] = len(s.svcEvents())
	}
	prod := k.produce(topic, 125)
	threeAt := eventually(t, 90*time.Second, "all three replicas running", func() (bool, string) {
		run := r.running()
		return len(run) == 3, fmt.Sprint(run)
	})
	// Each of them takes records while the others run.
	eventually(t, 30*time.Second, "each replica processing", func() (bool, string) {
		var n []int
		for i, s := range runs {
			n = append(n, len(processed(s.svcEvents()[before[i]:])))
		}
		return !slices.Contains(n, 0), fmt.Sprint(n)
	})
	prod.finish()
	r.waitProcessed(120 * time.Second)
	r.allAsleep("after the load")
	var ups []time.Time
	for _, s := range runs {
		for _, m := range s.logs() {
			at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(m["time"]))
			if m["msg"] == "standby: replica scaled_up" && at.After(loadAt) {
				ups = append(ups, at)
			}
		}
	}
	t.Logf("overload: three running %v after the load began (not an assertion); scale-ups at %v; wakes by replica %v", threeAt.Round(time.Millisecond), ups, r.kafkaWakes())
	if len(ups) < 2 {
		t.Errorf("%d scale-ups under the overload, want 2 at least", len(ups))
	}
	for i := 1; i < len(ups); i++ {
		for j := range i {
			if d := ups[i].Sub(ups[j]).Abs(); d < shareReplicaScaleUp {
				t.Errorf("two scale-ups %v apart: want one at a time, %v apart at least", d, shareReplicaScaleUp)
			}
		}
	}

	// The independent reader: every record processed; a record processed
	// twice has a delivery count of its own each time (a release gave it
	// back, and the broker counted the next delivery).
	recs := k.readTopic(topic)
	var evs []event
	for _, s := range runs {
		evs = append(evs, s.svcEvents()...)
	}
	dcs := shareDeliveries(evs)
	missing, dups := 0, 0
	for _, rec := range recs {
		d := dcs[po{rec.partition, rec.offset}]
		if len(d) == 0 {
			missing++
			continue
		}
		if len(d) > 1 {
			dups++
		}
		slices.Sort(d)
		if len(slices.Compact(slices.Clone(d))) != len(d) || d[0] < 1 {
			t.Errorf("offset %d processed with delivery counts %v: each processing must be a delivery of its own", rec.offset, d)
		}
	}
	t.Logf("%d records, %d processed more than once (each after a release)", len(recs), dups)
	if missing > 0 {
		t.Errorf("independent reader: %d of %d records never processed", missing, len(recs))
	}
	for i, s := range runs {
		if n := s.countLogs("standby: group hold failed") + s.countLogs("standby: group hold"); n != 0 {
			t.Errorf("replica %d: %d group-hold records; a share group has no hold", i, n)
		}
	}
}
