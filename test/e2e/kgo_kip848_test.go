package e2e

// franz-go group consumers on KIP-848 groups (kgo.ServerSideBalancer) and
// static members (kgo.InstanceID), checkpointed and restored by kcr on
// real CRIU against the real broker. The KIP-848 cases run on the broker with Kafka's production group settings
// ($KCR_KAFKA_PROD_BROKERS: group.initial.rebalance.delay.ms 3000), where a
// classic group that the checkpoint emptied waits 3 s before a restored
// member gets partitions. Members are read from the broker (ConsumerGroupDescribe
// for KIP-848 groups, DescribeGroups for classic ones).

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gmember is a group member as the broker describes it.
type gmember struct {
	id, instance, client string
	parts                int // partitions of the topic assigned to it
}

func (m gmember) String() string {
	s := m.id + " client " + m.client
	if m.instance != "" {
		s += " instance " + m.instance
	}
	return fmt.Sprintf("{%s: %d partitions}", s, m.parts)
}

// members describes group: a KIP-848 group (kip848) with
// ConsumerGroupDescribe, a classic one with DescribeGroups. A group with no
// members, or none yet, gives none.
func (k *kafkaEnv) members(group, topic string, kip848 bool) ([]gmember, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	str := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	var out []gmember
	if kip848 {
		gs, err := k.adm.DescribeConsumerGroups(ctx, group)
		if err != nil {
			return nil, err
		}
		g := gs[group]
		if g.Err != nil {
			if strings.Contains(g.Err.Error(), "GROUP_ID_NOT_FOUND") {
				return nil, nil
			}
			return nil, g.Err
		}
		for _, m := range g.Members {
			out = append(out, gmember{m.MemberID, str(m.InstanceID), m.ClientID, len(m.Assignment[topic])})
		}
		return out, nil
	}
	g, err := k.describe(group)
	if err != nil {
		return nil, err
	}
	for _, m := range g.Members {
		n := 0
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range c.Topics {
				if tp.Topic == topic {
					n += len(tp.Partitions)
				}
			}
		}
		out = append(out, gmember{m.MemberID, str(m.InstanceID), m.ClientID, n})
	}
	return out, nil
}

// waitMembers polls the group's members until ok accepts them.
func (k *kafkaEnv) waitMembers(group, topic string, kip848 bool, timeout time.Duration, what string, ok func([]gmember) bool) []gmember {
	k.t.Helper()
	var ms []gmember
	eventually(k.t, timeout, what, func() (bool, string) {
		var err error
		if ms, err = k.members(group, topic, kip848); err != nil {
			return false, err.Error()
		}
		return ok(ms), fmt.Sprint(ms)
	})
	return ms
}

func memberOf(ms []gmember, f func(gmember) bool) (gmember, bool) {
	for _, m := range ms {
		if f(m) {
			return m, true
		}
	}
	return gmember{}, false
}

// firstProc returns the time of the first "proc" event of hpid among evs
// (zero if none).
func firstProc(evs []event, hpid int) time.Time {
	for _, e := range of(evs, hpid) {
		if e["ev"] == "proc" {
			return time.Unix(0, int64(num(e["t"])))
		}
	}
	return time.Time{}
}

// groupErrors returns the fetch and commit errors a process logged.
func groupErrors(evs []event, hpid int) []string {
	var out []string
	for _, e := range of(evs, hpid) {
		if e["ev"] == "fetch-error" || e["ev"] == "commit-error" {
			out = append(out, e.str("err"))
		}
	}
	return out
}

// kgo 848-1. A KIP-848 group consumer (kgo.ServerSideBalancer) on the broker
// with production group settings is checkpointed and restored: the
// checkpoint leaves the group (it is empty at the dump), the restored copy
// joins under a new member id (kgo draws it, KIP-1082) and a new client id
// and owns all partitions again, no record committed before the checkpoint
// is processed again, and every record is processed.
func TestKgoKIP848Restore(t *testing.T) {
	k := needKafkaProd(t)
	topic, group, prod := k.groupTopic("k848", 3, 100)
	const base = "k848"
	a := k.startBin(kgoBin, "-topic", topic, "-group", group, "-consume", "-balancer", "server", "-client-id", base)
	ms0 := k.waitMembers(group, topic, true, 60*time.Second, "one KIP-848 member owning the 3 partitions", func(ms []gmember) bool {
		return len(ms) == 1 && ms[0].parts == 3 && ms[0].client == base
	})
	a.waitProcessed(0, 50, 30*time.Second)

	img := t.TempDir() + "/img"
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	rep := kgoReport(t, manifestResource(t, img, "kgo/"+base))
	t.Logf("reader report in the manifest: %+v %+v", *rep.Checkpoint, rep.GroupCheckpoint)
	if rep.GroupCheckpoint == nil || !rep.LeftGroup {
		t.Errorf("report: want left_group true")
	}
	if ms, err := k.members(group, topic, true); err != nil || len(ms) != 0 {
		t.Errorf("after the checkpoint the group has members %v (%v): want none", ms, err)
	}
	atCheckpoint, err := k.committed(group, topic)
	if err != nil {
		t.Fatal(err)
	}

	na := len(a.events())
	start := time.Now()
	pid, out := restore(t, img)
	inst, _ := out["instance_id"].(string)
	want := base + "-" + prefix8(inst)
	ms := k.waitMembers(group, topic, true, 60*time.Second, "the restored copy owning the 3 partitions as "+want, func(ms []gmember) bool {
		return len(ms) == 1 && ms[0].parts == 3 && ms[0].client == want
	})
	t.Logf("member before the checkpoint %v, after the restore %v", ms0[0], ms[0])
	if ms[0].id == ms0[0].id {
		t.Errorf("the restored copy joined under the image's member id %s", ms[0].id)
	}
	a.waitProcessed(na, 50, 30*time.Second)
	if first := firstProc(a.since(na), pid); !first.IsZero() {
		t.Logf("kcr restore started → first record processed: %v (not an assertion)", first.Sub(start).Round(time.Millisecond))
	}
	var again []string
	for x := range processed(a.since(na)) {
		if c, ok := atCheckpoint[x.p]; ok && x.o < c {
			again = append(again, fmt.Sprintf("%d/%d", x.p, x.o))
		}
	}
	if len(again) > 0 {
		t.Errorf("%d records committed before the checkpoint (committed %v) processed again after the restore, e.g. %v", len(again), atCheckpoint, again[:min(10, len(again))])
	}
	prod.finish()
	produced, _ := prod.snapshot()
	ends := k.endOffsets(topic)
	k.waitCommitted(group, topic, ends, 60*time.Second)
	checkProcessed(t, ends, produced, map[string]*kapp{"a": a})
	if errs := groupErrors(a.events(), pid); len(errs) > 0 {
		t.Errorf("the restored copy logged errors: %v", errs)
	}
	a.stop(pid)
}

// kgo 848-2. kcr restore --count 3 of a KIP-848 group consumer: the broker
// lists three members with three distinct member ids (none the image's),
// each with its own client id and partitions, and every clone processes
// records.
func TestKgoKIP848Clones(t *testing.T) {
	k := needKafkaProd(t)
	topic, group, prod := k.groupTopic("k848c", 6, 100)
	const base = "k848c"
	pid, a := k.runBin(kgoBin, "-topic", topic, "-group", group, "-consume", "-balancer", "server", "-client-id", base)
	ms0 := k.waitMembers(group, topic, true, 60*time.Second, "one KIP-848 member", func(ms []gmember) bool {
		return len(ms) == 1 && ms[0].parts == 6
	})
	a.waitProcessed(0, 20, 30*time.Second)
	img := checkpointGone(t, pid)
	clones := restoreClones(t, img, base, 3)
	mark := len(a.events())
	ms := k.waitMembers(group, topic, true, 60*time.Second, "three members sharing the 6 partitions", func(ms []gmember) bool {
		n := 0
		for _, m := range ms {
			if m.parts == 0 {
				return false
			}
			n += m.parts
		}
		return len(ms) == 3 && n == 6
	})
	t.Logf("the image's member %v; the clones' %v", ms0[0], ms)
	ids := map[string]bool{}
	for _, m := range ms {
		ids[m.id] = true
	}
	if len(ids) != 3 || ids[ms0[0].id] {
		t.Errorf("member ids %v: want 3 distinct ones, none the image's %s", slices.Collect(mapKeys(ids)), ms0[0].id)
	}
	for _, c := range clones {
		if _, ok := memberOf(ms, func(m gmember) bool { return m.client == clientOf(base, c) }); !ok {
			t.Errorf("no member with clone %s's client id %s: %v", c.Name, clientOf(base, c), ms)
		}
	}
	eventually(t, 30*time.Second, "every clone processing records", func() (bool, string) {
		var s []string
		ok := true
		for _, c := range clones {
			n := len(processed(of(a.since(mark), c.PID)))
			ok = ok && n > 0
			s = append(s, fmt.Sprintf("%s: %d", c.Name, n))
		}
		return ok, strings.Join(s, ", ")
	})
	for _, c := range clones {
		if errs := groupErrors(a.events(), c.PID); len(errs) > 0 {
			t.Errorf("clone %s logged errors: %v", c.Name, errs)
		}
	}
	prod.finish()
	stopAll(t, a, clones)
}

// kgo 848-3, and the measurement of docs/franz-go-kip848.md. A group
// consumer alone in its group, on the broker with production group
// settings, is checkpointed under load and restored 2 s later, once with
// the classic protocol and once with KIP-848, alternating: the restored
// copy must process records again (the assertion). The time from the start
// of kcr restore to the first record it processed is logged, with medians
// over KCR_KGO_BENCH_RUNS rounds (default 1): the classic group was emptied
// by the checkpoint, so the broker holds the restored member's join for
// group.initial.rebalance.delay.ms; a KIP-848 group has no such delay.
func TestKgoRestoreFirstRecord(t *testing.T) {
	k := needKafkaProd(t)
	runs := 1
	if s := os.Getenv("KCR_KGO_BENCH_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("KCR_KGO_BENCH_RUNS=%q: want a positive number", s)
		}
		runs = n
	}
	modes := []struct{ name, balancer string }{{"classic", ""}, {"kip848", "server"}}
	took := map[string][]time.Duration{}
	for i := range runs {
		for _, m := range modes {
			d := restoreToFirstRecord(t, k, m.balancer)
			t.Logf("round %d, %s: kcr restore started → first record processed %v", i+1, m.name, d.Round(time.Millisecond))
			took[m.name] = append(took[m.name], d)
		}
	}
	for _, m := range modes {
		ds := slices.Clone(took[m.name])
		slices.Sort(ds)
		t.Logf("%s: median %v over %d runs (all %v)", m.name, ds[len(ds)/2].Round(time.Millisecond), len(ds), took[m.name])
	}
}

// restoreToFirstRecord runs one round of TestKgoRestoreFirstRecord.
func restoreToFirstRecord(t *testing.T, k *kafkaEnv, balancer string) time.Duration {
	t.Helper()
	topic, group, prod := k.groupTopic("kfirst", 3, 200)
	defer prod.finish()
	a := k.startBin(kgoBin, consumeArgs(topic, group, "kfirst", balancer, "")...)
	a.waitProcessed(0, 100, 60*time.Second)
	img := t.TempDir() + "/img"
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	// The report says whether the restore will wait for the initial
	// rebalance delay: a sole classic member, not a KIP-848 one.
	if rep := kgoReport(t, manifestResource(t, img, "kgo/kfirst")); rep.GroupCheckpoint == nil || rep.InitialDelay != (balancer == "") {
		t.Errorf("report %+v: want initial_rebalance_delay %v", rep.GroupCheckpoint, balancer == "")
	}
	time.Sleep(2 * time.Second) // down for a while, under load (not an assertion)
	na := len(a.events())
	start := time.Now()
	pid, _ := restore(t, img)
	a.waitProcessed(na, 1, 60*time.Second)
	d := firstProc(a.since(na), pid).Sub(start)
	a.stop(pid)
	return d
}
