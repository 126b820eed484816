package e2e

// franz-go end-to-end tests (issue 11): kgoapp, whose idempotent kgo
// producer is a kgohooks.Client, checkpointed and restored by kcr on real
// CRIU against the real broker. Records and producer ids are read from the
// broker with the test's own franz-go client (kadm DescribeProducers).

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// producerIDs returns the ids of the producers the broker knows for topic,
// with how many partitions each wrote to.
func (k *kafkaEnv) producerIDs(topic string) map[int64]int {
	t := k.t
	t.Helper()
	var ids map[int64]int
	eventually(t, 30*time.Second, "the producers of "+topic, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err := k.adm.DescribeProducers(ctx, kadm.TopicsSet{topic: nil})
		if err != nil {
			return false, err.Error()
		}
		ids = map[int64]int{}
		var errs []string
		d.EachPartition(func(p kadm.DescribedProducersPartition) {
			if p.Err != nil {
				errs = append(errs, p.Err.Error())
			}
			for id := range p.ActiveProducers {
				ids[id]++
			}
		})
		return len(errs) == 0, fmt.Sprint(errs)
	})
	return ids
}

// newIDs returns the producer ids of now that are not in before, sorted.
func newIDs(before, now map[int64]int) []int64 {
	var out []int64
	for id := range now {
		if _, ok := before[id]; !ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// kgo 1. An idempotent kgo producer under load (200 records/s) is
// checkpointed and restored: every record it saw acknowledged is on the
// topic, and the broker lists a producer id after the restore that it did
// not list before (the restored copy never writes under the image's).
func TestKgoProducerCheckpoint(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("kgoprod", 3)
	a := k.startBin(kgoBin, "-topic", topic, "-produce-rate", "200", "-client-id", "kprod")
	a.waitAcked(300, 30*time.Second)
	before := k.producerIDs(topic)
	if len(before) != 1 {
		t.Fatalf("before the checkpoint the broker lists producers %v for %s: want one", before, topic)
	}

	img := t.TempDir() + "/img"
	n0 := len(a.events())
	mustKCR(t, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpointed process is still running")
	}
	ackedBefore := acked(a.events())
	pending, _ := a.pendingAt(n0)
	rep := manifestResource(t, img, "kgo/kprod")
	t.Logf("at the checkpoint: %d records acknowledged, %d in the app's hands; client report in the manifest: %v",
		len(ackedBefore), len(pending), rep)
	if len(pending) != 0 {
		t.Errorf("records %s produced and not acknowledged when the client's hook had finished: kgohooks must flush them all", runsOf(pending, 10))
	}

	n1 := len(a.events())
	pid, out := restore(t, img)
	inst, _ := out["instance_id"].(string)
	ev := a.waitAfter(n1, 30*time.Second)
	if want := "kprod-" + prefix8(inst); ev.str("kind") != "restore" || ev.str("writer_client") != want {
		t.Fatalf("after-restore event %v: want kind restore, client id %s", ev, want)
	}
	a.waitAcked(len(ackedBefore)+300, 30*time.Second)
	after := k.producerIDs(topic)
	fresh := newIDs(before, after)
	t.Logf("producer ids on the broker: before %v, after the restore %v", slices.Collect(maps.Keys(before)), slices.Collect(maps.Keys(after)))
	if len(fresh) != 1 {
		t.Errorf("after the restore the broker lists new producer ids %v: want exactly one", fresh)
	}
	// Records of the restored copy (by their instance header) are on the
	// topic: it produced, and under the new id only (checked above).
	a.stop(pid)
	all := acked(a.events())
	k.checkAcked(topic, all)
}

// kgo 2. kcr restore --count 3 of an idempotent kgo producer started with
// kcr run: all three clones produce, every record any of them saw
// acknowledged is on the topic (attributed by the writer's host PID), and
// the broker lists three producer ids the original did not use.
func TestKgoClones(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("kgoclones", 3)
	const base = "kc"
	pid, a := k.runBin(kgoBin, "-topic", topic, "-produce-rate", "100", "-client-id", base)
	a.waitAcked(100, 30*time.Second)
	before := k.producerIDs(topic)
	img := checkpointGone(t, pid)
	orig := acked(of(a.events(), pid))

	clones := restoreClones(t, img, base, 3)
	mark := len(a.events())
	eventually(t, 40*time.Second, "every clone producing", func() (bool, string) {
		ok, s := true, ""
		for _, c := range clones {
			n := len(acked(of(a.since(mark), c.PID)))
			ok = ok && n >= 200
			s += fmt.Sprintf("%s: %d acknowledged; ", c.Name, n)
		}
		return ok, s
	})
	for _, c := range clones {
		ev := of(a.events(), c.PID)
		var after event
		for _, e := range ev {
			if e["ev"] == "after" {
				after = e
			}
		}
		if after.str("kind") != "restore" || after.str("writer_client") != clientOf(base, c) {
			t.Errorf("clone %s after-restore event %v: want kind restore, client id %s", c.Name, after, clientOf(base, c))
		}
	}
	fresh := newIDs(before, k.producerIDs(topic))
	t.Logf("producer ids: the original's %v, new after the restore %v", slices.Collect(maps.Keys(before)), fresh)
	if len(fresh) != 3 {
		t.Errorf("the broker lists %d new producer ids %v after restoring three clones: want 3", len(fresh), fresh)
	}
	stopAll(t, a, clones)

	// The clones continue from one record counter, so numbers collide:
	// attribute records to their writer's host PID.
	type rec struct{ hpid, n int }
	ackedRecs := map[rec]bool{}
	for _, e := range a.events() {
		if e["ev"] != "acked" {
			continue
		}
		h := int(num(e["rhpid"]))
		for n := int(num(e["from"])); n <= int(num(e["to"])); n++ {
			ackedRecs[rec{h, n}] = true
		}
	}
	on := map[rec]bool{}
	for _, r := range k.readTopic(topic) {
		on[rec{r.hpid, r.n}] = true
	}
	var missing []rec
	for r := range ackedRecs {
		if !on[r] {
			missing = append(missing, r)
		}
	}
	t.Logf("the original acknowledged %d records; %d acknowledged (writer, number) pairs in all, %d on the topic", len(orig), len(ackedRecs), len(on))
	if len(missing) > 0 {
		t.Errorf("%d acknowledged records missing from the topic, e.g. %v", len(missing), missing[:min(10, len(missing))])
	}
}
