package e2e

// franz-go share-group consumers (KIP-932, kgohooks.ShareConsumer)
// checkpointed with acquired records in hand, restored, and cloned, on real
// CRIU against the real broker.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// shareEarliest makes the share group start at the earliest offset of its
// topics (its share.auto.offset.reset group config; Kafka's default is
// latest).
func (k *kafkaEnv) shareEarliest(group string) {
	k.t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name = "share.auto.offset.reset"
	v := "earliest"
	cfg.Value = &v
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, k.cl)
	if err == nil && len(resp.Resources) == 1 && resp.Resources[0].ErrorCode != 0 {
		err = fmt.Errorf("error code %d: %v", resp.Resources[0].ErrorCode, resp.Resources[0].ErrorMessage)
	}
	if err != nil {
		k.t.Fatalf("share.auto.offset.reset of group %s: %v", group, err)
	}
}

// shareReport reads a ShareConsumer's before-checkpoint report from the
// image manifest.
func shareReport(t *testing.T, img, name string) kgohooks.ShareReport {
	t.Helper()
	b, _ := json.Marshal(manifestResource(t, img, name))
	var r kgohooks.ShareReport
	if err := json.Unmarshal(b, &r); err != nil || r.ShareCheckpoint == nil {
		t.Fatalf("manifest details %s: not a share consumer's before-checkpoint report (%v)", b, err)
	}
	return r
}

// shareDeliveries returns, for each partition offset, the delivery counts
// with which some process logged it processed.
func shareDeliveries(evs []event) map[po][]int {
	m := map[po][]int{}
	for _, e := range evs {
		if e["ev"] == "proc" {
			x := po{int32(num(e["p"])), int64(num(e["from"]))}
			m[x] = append(m[x], int(num(e["dc"])))
		}
	}
	return m
}

// kgo share-1. A share consumer is checkpointed in the middle of a batch
// (its handler spends 100 ms a record, 20 records a poll, and the hook
// waits 100 ms for it): the report counts the records it held, the member
// leaves with every acknowledgement flushed and no connection open. The
// image is restored, then the restored copy is checkpointed again and its
// image restored as 3 clones, which all process records of the 2-partition
// topic as distinct members. Read by an independent reader, no record is
// missing; a record processed twice was released by a checkpoint and
// delivered again (delivery count 2 or more). The broker then reports the
// share group's backlog at 0 (kafkawake.ShareBacklog).
func TestKgoShareCheckpointRestoreClones(t *testing.T) {
	k := needKafka(t)
	topic, group, prod := k.groupTopic("kshare", 2, 15)
	k.shareEarliest(group)
	const base = "kshare"
	args := []string{"-topic", topic, "-group", group, "-share", "-share-max", "20", "-proc-delay", "100ms", "-held-wait", "100ms", "-client-id", base}
	pid0, a := k.runBin(kgoBin, args...)
	// 5 records into its third batch: the checkpoint catches it with
	// records in hand (a batch takes 2 s).
	a.waitProcessed(0, 45, 60*time.Second)
	img := checkpointGone(t, pid0)
	var polls []string
	for _, e := range tail(of(a.events(), pid0), 12) {
		if e["ev"] == "polled" {
			polls = append(polls, fmt.Sprintf("%v in %vms", e["records"], e["ms"]))
		}
	}
	t.Logf("the last polls before the checkpoint: %v", polls)
	rep := shareReport(t, img, "kgo-share/"+group)
	t.Logf("first checkpoint: %+v", *rep.ShareCheckpoint)
	if !rep.AcksFlushed || !rep.LeftGroup || rep.ConnectionsOpen != 0 || rep.RecordsHeld == 0 {
		t.Errorf("report %+v: want records held, acks flushed, the group left, no connection open", *rep.ShareCheckpoint)
	}
	released := rep.RecordsReleased

	mark := len(a.events())
	start := time.Now()
	pid1, out := restore(t, img)
	if c := a.waitAfter(mark, 30*time.Second); c.str("reader_client") != base+"-"+prefix8(out["instance_id"].(string)) {
		t.Errorf("restored copy's client id %q: want the base suffixed with its instance id", c.str("reader_client"))
	}
	eventually(t, 60*time.Second, "the restored copy processing records", func() (bool, string) {
		n := len(processed(of(a.since(mark), pid1)))
		return n >= 25, fmt.Sprintf("%d processed", n)
	})
	// The image's handler goes on with its released batch first; the new
	// member's first record is that of its first poll with records.
	for _, e := range of(a.since(mark), pid1) {
		if e["ev"] == "polled" && num(e["records"]) > 0 {
			t.Logf("kcr restore started → the new member's first records polled: %v (not an assertion)", time.Unix(0, int64(num(e["t"]))).Sub(start).Round(time.Millisecond))
			break
		}
	}
	img2 := checkpointGone(t, pid1)
	rep2 := shareReport(t, img2, "kgo-share/"+group)
	t.Logf("second checkpoint: %+v", *rep2.ShareCheckpoint)
	if !rep2.AcksFlushed || !rep2.LeftGroup || rep2.ConnectionsOpen != 0 || rep2.RecordsHeld == 0 {
		t.Errorf("report %+v: want records held, acks flushed, the group left, no connection open", *rep2.ShareCheckpoint)
	}
	released += rep2.RecordsReleased

	mark = len(a.events())
	clones := restoreClones(t, img2, base, 3)
	eventually(t, 60*time.Second, "every clone processing records", func() (bool, string) {
		var s []string
		ok := true
		for _, c := range clones {
			n := len(processed(of(a.since(mark), c.PID)))
			ok = ok && n >= 5
			s = append(s, fmt.Sprintf("%s: %d", c.Name, n))
		}
		return ok, strings.Join(s, ", ")
	})
	prod.finish()
	ends := k.endOffsets(topic)
	var missing []po
	eventually(t, 90*time.Second, "every record on the topic processed", func() (bool, string) {
		got := shareDeliveries(a.events())
		missing = missing[:0]
		for _, r := range k.readTopic(topic) {
			if x := (po{r.partition, r.offset}); len(got[x]) == 0 {
				missing = append(missing, x)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d of %v not processed, e.g. %v", len(missing), ends, missing[:min(10, len(missing))])
	})
	// What kcr standby would read of the share group while it sleeps.
	eventually(t, 60*time.Second, "the share group's backlog at 0", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b, err := kafkawake.ShareBacklog(ctx, k.cl, group)
		if err != nil {
			return false, err.Error()
		}
		n := int64(0)
		for _, ps := range b {
			for _, lag := range ps {
				n += lag
			}
		}
		return len(b[topic]) == 2 && n == 0, fmt.Sprint(b)
	})
	var unexplained []string
	dups := 0
	for x, dcs := range shareDeliveries(a.events()) {
		if len(dcs) < 2 {
			continue
		}
		dups++
		if maxInt(dcs) < 2 {
			unexplained = append(unexplained, fmt.Sprintf("%d/%d %v", x.p, x.o, dcs))
		}
	}
	t.Logf("%d records processed more than once; the checkpoints released %d", dups, released)
	if len(unexplained) > 0 {
		t.Errorf("%d records processed twice without a redelivery, e.g. %v", len(unexplained), unexplained[:min(10, len(unexplained))])
	}
	for _, c := range clones {
		if errs := groupErrors(a.events(), c.PID); len(errs) > 0 {
			t.Errorf("clone %s logged errors: %v", c.Name, errs)
		}
	}
	stopAll(t, a, clones)
}

func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// kgo share-2, and the measurement of docs/benchmarks-kafka.md (Share
// groups). A share consumer that keeps up with its topic (no time spent on
// a record) is checkpointed under load, left dead 2 s, and restored: it
// hands its batch back in time (nothing released) and the restored copy,
// a new member, processes records again (the assertion). The time from the
// start of kcr restore to its first record is logged, with the median over
// KCR_KGO_BENCH_RUNS rounds (default 1).
func TestKgoShareRestoreFirstRecord(t *testing.T) {
	k := needKafka(t)
	runs := 1
	if s := os.Getenv("KCR_KGO_BENCH_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("KCR_KGO_BENCH_RUNS=%q: want a positive number", s)
		}
		runs = n
	}
	var took []time.Duration
	for i := range runs {
		topic, group, prod := k.groupTopic("ksharefirst", 1, 100)
		k.shareEarliest(group)
		a := k.startBin(kgoBin, "-topic", topic, "-group", group, "-share", "-client-id", "ksharefirst")
		a.waitProcessed(0, 100, 60*time.Second)
		img := t.TempDir() + "/img"
		runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
		<-a.done
		if rep := shareReport(t, img, "kgo-share/"+group); rep.RecordsReleased != 0 || !rep.LeftGroup {
			t.Errorf("report %+v: want nothing released (the batch handed back) and the group left", *rep.ShareCheckpoint)
		}
		time.Sleep(2 * time.Second) // down for a while, under load (not an assertion)
		na := len(a.events())
		start := time.Now()
		pid, _ := restore(t, img)
		a.waitProcessed(na, 1, 60*time.Second)
		d := firstProc(a.since(na), pid).Sub(start)
		t.Logf("round %d: kcr restore started → first record processed %v", i+1, d.Round(time.Millisecond))
		took = append(took, d)
		prod.finish()
		a.stop(pid)
	}
	slices.Sort(took)
	t.Logf("share group: median %v over %d runs (all %v)", took[len(took)/2].Round(time.Millisecond), len(took), took)
}
