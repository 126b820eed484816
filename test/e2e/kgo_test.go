package e2e

// franz-go end-to-end tests: kgoapp, whose idempotent kgo
// producer is a kgohooks.Client, checkpointed and restored by kcr on real
// CRIU against the real broker. Records and producer ids are read from the
// broker with the test's own franz-go client (kadm DescribeProducers).

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
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
// kgoReport decodes a kgohooks resource's manifest details (see
// manifestResource) into its typed before-checkpoint report: the manifest's
// keys are the Report's json tags.
func kgoReport(t *testing.T, details map[string]any) kgohooks.Report {
	t.Helper()
	b, err := json.Marshal(details)
	if err != nil {
		t.Fatal(err)
	}
	var r kgohooks.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("manifest details %v as a kgohooks.Report: %v", details, err)
	}
	if r.Checkpoint == nil {
		t.Fatalf("manifest details %v: not a before-checkpoint report", details)
	}
	return r
}

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
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
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
	// A producer without a group is kept for a resume, with no
	// connection open at the dump (a restore replaces it).
	if r := kgoReport(t, rep); r.KeptClient == nil || r.ConnectionsOpen != 0 || r.RecordsUnflushed != 0 {
		t.Errorf("client report %v: want kept_for_resume, connections_open 0, nothing unflushed", rep)
	}
	checkNoBrokerSockets(t, a, n0)

	n1 := len(a.events())
	pid, out := restore(t, img)
	inst, _ := out["instance_id"].(string)
	ev := a.waitAfter(n1, 30*time.Second)
	if want := "kprod-" + prefix8(inst); ev.str("kind") != "restore" || ev.str("writer_client") != want {
		t.Fatalf("after-restore event %v: want kind restore, client id %s", ev, want)
	}
	// A record in the app's hands at the checkpoint was waiting at the
	// gate (kgohooks flushes everything it was given): acknowledged after.
	eventually(t, 30*time.Second, "the records in hand at the checkpoint acknowledged after the restore", func() (bool, string) {
		now := acked(a.since(n1))
		var miss []int
		for _, n := range pending {
			if now[n] == 0 {
				miss = append(miss, n)
			}
		}
		return len(miss) == 0, runsOf(miss, 10)
	})
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
	k.checkAckedByWriter(topic, a, len(orig))
}

// checkAckedByWriter checks that every record a writer saw acknowledged is
// on topic. Clones continue from one record counter, so numbers collide:
// records are attributed to their writer's host PID.
func (k *kafkaEnv) checkAckedByWriter(topic string, a *kapp, orig int) {
	t := k.t
	t.Helper()
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
	t.Logf("the original acknowledged %d records; %d acknowledged (writer, number) pairs in all, %d on the topic", orig, len(ackedRecs), len(on))
	if len(missing) > 0 {
		t.Errorf("%d acknowledged records missing from the topic, e.g. %v", len(missing), missing[:min(10, len(missing))])
	}
}

// checkNoBrokerSockets checks, from kgoapp's last before-checkpoint hook
// after event skip, that the kernel listed no TCP socket of the process to
// a broker just before the dump.
func checkNoBrokerSockets(t *testing.T, a *kapp, skip int) {
	t.Helper()
	for _, e := range a.since(skip) {
		if e["ev"] == "pending" {
			if n, ok := e["broker_sockets"].(float64); !ok || n != 0 {
				t.Errorf("TCP sockets to the broker just before the dump: %v, want 0", e["broker_sockets"])
			}
			return
		}
	}
	t.Errorf("no pending event after the checkpoint")
}

// kgo 1b. An idempotent kgo producer checkpointed with --leave-running
// goes on with the same kgo client, reconnected: the producer id it reports
// after the resume is the one before, and the broker lists exactly one new
// producer id, the restored copy's, beside it. Both produce; every record
// either saw acknowledged is on the topic.
func TestKgoProducerLeaveRunning(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("kgolr", 3)
	const base = "klr"
	pid, a := k.runBin(kgoBin, "-topic", topic, "-produce-rate", "100", "-client-id", base, "-listen", "")
	a.waitAcked(100, 30*time.Second)
	producerOf := func(hpid, skip int) int64 {
		var id int64 = -1
		eventually(t, 30*time.Second, fmt.Sprintf("the producer id of PID %d", hpid), func() (bool, string) {
			for _, e := range of(a.since(skip), hpid) {
				if e["ev"] == "producer" && e.str("err") == "" {
					id = int64(num(e["id"]))
					return true, ""
				}
			}
			return false, ""
		})
		return id
	}
	id0 := producerOf(pid, 0)
	before := k.producerIDs(topic)
	if _, ok := before[id0]; !ok || len(before) != 1 {
		t.Fatalf("the broker lists producers %v, the app reports %d: want only the app's", before, id0)
	}

	img := t.TempDir() + "/img"
	n0 := len(a.events())
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", img, strconv.Itoa(pid))
	rep := manifestResource(t, img, "kgo/"+base)
	if r := kgoReport(t, rep); r.KeptClient == nil || r.ConnectionsOpen != 0 {
		t.Errorf("client report %v: want kept_for_resume, connections_open 0", rep)
	}
	checkNoBrokerSockets(t, a, n0)
	after := a.waitAfter(n0, 30*time.Second)
	if after.str("kind") != "resume" || after.str("writer_client") != base {
		t.Fatalf("the original's after-checkpoint event %v: want kind resume, client id %s", after, base)
	}
	if id := producerOf(pid, n0); id != id0 {
		t.Errorf("after --leave-running the original reports producer id %d, want %d (the same kgo client)", id, id0)
	}
	orig := len(acked(of(a.events(), pid)))

	clones := restoreClones(t, img, base, 1)
	c := clones[0]
	mark := len(a.events())
	idc := producerOf(c.PID, n0)
	eventually(t, 40*time.Second, "both producing", func() (bool, string) {
		no, nc := len(acked(of(a.since(mark), pid))), len(acked(of(a.since(mark), c.PID)))
		return no >= 100 && nc >= 100, fmt.Sprintf("original %d, copy %d acknowledged", no, nc)
	})
	now := k.producerIDs(topic)
	fresh := newIDs(before, now)
	t.Logf("producer ids: the original's %d before the checkpoint, the copy's %d; the broker lists new %v", id0, idc, fresh)
	if _, ok := now[id0]; !ok || len(fresh) != 1 || fresh[0] != idc || idc == id0 {
		t.Errorf("the broker lists %v (new %v): want the original's %d and one new id, the copy's %d", slices.Collect(maps.Keys(now)), fresh, id0, idc)
	}
	stopAll(t, a, []kclone{c, {PID: pid, Name: "original"}})
	k.checkAckedByWriter(topic, a, orig)
}

// readCommitted reads topic with a read_committed consumer of the test's
// own until every src in want was seen, then 2 s more for duplicates, and
// returns how often each "src" header was seen.
func (k *kafkaEnv) readCommitted(topic string, want map[string]bool) map[string]int {
	t := k.t
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-committed"),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]int{}
	missing := func() int {
		n := 0
		for s := range want {
			if seen[s] == 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	var quiet time.Time
	for {
		if m := missing(); m == 0 && quiet.IsZero() {
			quiet = time.Now().Add(2 * time.Second)
		} else if m > 0 && time.Now().After(deadline) {
			t.Fatalf("read_committed %s: %d of %d input records never appeared", topic, m, len(want))
		}
		if !quiet.IsZero() && time.Now().After(quiet) {
			return seen
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "src" {
					seen[string(h.Value)]++
				}
			}
		})
	}
}

// kgo 3. A transactional consume-transform-produce loop (a kgohooks
// GroupTransactSession) is checkpointed while the test feeds its input, so
// transactions are in flight, and restored: a read_committed consumer of
// the output sees every input record exactly once. With --leave-running the
// original resumes under its transactional id and the restored copy runs
// under its own (SuffixTxnID, the default): both commit, side by side in the
// group, and the output is still exactly once.
func TestKgoTransactCheckpoint(t *testing.T) {
	for _, leave := range []bool{false, true} {
		name := "restore"
		if leave {
			name = "leave-running"
		}
		t.Run(name, func(t *testing.T) { testKgoTransact(t, kgoTxnCase{leave: leave}) })
	}
}

// The loop leaves a transaction with records open at the checkpoint (it
// ends it only after the restore), so kgohooks aborts it (AbortOpenTxn, the
// default): the manifest says so, the loop's End of it after the restore
// reports it not committed, and its inputs, whose offsets were not
// committed, are consumed again and appear exactly once in the
// read_committed output.
func TestKgoTransactAbortAtCheckpoint(t *testing.T) {
	testKgoTransact(t, kgoTxnCase{hold: true})
}

// KeepTxnID with --leave-running, then a restore beside the original: both
// hold one transactional id, the one that initialized it last (the restored
// copy) fences the other. The fenced one gets kgo's fencing error from its
// transaction calls (kgohooks.IsFenced) and stops; the other goes on
// committing, and the read_committed output is exactly once.
func TestKgoKeepTxnIDFencing(t *testing.T) {
	testKgoTransact(t, kgoTxnCase{leave: true, keep: true})
}

// kgoTxnCase selects a variant of the transactional loop test.
type kgoTxnCase struct {
	leave bool // checkpoint with --leave-running, restore beside the original
	hold  bool // the loop holds a transaction open at the checkpoint
	keep  bool // KeepTxnID
}

func testKgoTransact(t *testing.T, tc kgoTxnCase) {
	k := needKafka(t)
	in, out := k.newTopic("kgoin", 3), k.newTopic("kgoout", 3)
	group := uniqueName("kgoetl")
	const base, txn = "ketl", "ketl-txn"
	appArgs := []string{"-transform-from", in, "-topic", out, "-group", group, "-txn-id", txn, "-client-id", base}
	if tc.hold {
		appArgs = append(appArgs, "-hold-txn")
	}
	if tc.keep {
		appArgs = append(appArgs, "-keep-txn-id")
	}
	pid, a := k.runBin(kgoBin, appArgs...)
	prod := k.produce(in, 100)
	committedTxns := func(evs []event, hpid int) int {
		n := 0
		for _, e := range of(evs, hpid) {
			if e["ev"] == "txn" && e["committed"] == true {
				n++
			}
		}
		return n
	}
	eventually(t, 60*time.Second, "the loop committing transactions", func() (bool, string) {
		n := committedTxns(a.events(), pid)
		return n >= 10, fmt.Sprintf("%d committed", n)
	})

	members := func() []string {
		g, err := k.describe(group)
		if err != nil {
			t.Fatalf("describe group %s: %v", group, err)
		}
		var ids []string
		for _, m := range g.Members {
			ids = append(ids, m.MemberID)
		}
		return ids
	}
	members0 := members()

	img := t.TempDir() + "/img"
	args := []string{"checkpoint", "-o", img}
	if tc.leave {
		args = append(args, "--leave-running")
	}
	if tc.hold {
		// kgohooks gives the application half the budget to end the
		// transaction itself before aborting it.
		args = append(args, "--hook-budget", "4s")
	}
	n0 := len(a.events())
	runKCR(t, kcrOpts{must: true}, append(args, strconv.Itoa(pid))...)
	rep := manifestResource(t, img, "kgo/"+base)
	t.Logf("session report in the manifest: %v", rep)
	var held event
	if tc.hold {
		for _, e := range of(a.since(n0), pid) {
			if e["ev"] == "held" {
				held = e
			}
		}
		if held == nil || num(held["records"]) == 0 {
			t.Fatalf("the loop did not hold a transaction with records at the checkpoint: %v", a.since(n0))
		}
		if kgoReport(t, rep).Transaction != "aborted" {
			t.Fatalf("session report %v: want transaction aborted (AbortOpenTxn)", rep)
		}
	}
	if !tc.leave {
		eventually(t, 10*time.Second, "the checkpointed process to be gone", func() (bool, string) { return !alive(pid), "" })
	} else {
		// --leave-running: the original stays in the group as the same
		// member, with the same kgo session (kgohooks.LeaveRunning).
		if r := kgoReport(t, rep); r.GroupCheckpoint == nil || r.LeftGroup || r.KeptClient == nil {
			t.Errorf("session report %v: want left_group false, kept_for_resume (--leave-running)", rep)
		}
		if now := members(); len(members0) != 1 || !slices.Equal(now, members0) {
			t.Errorf("group members before the checkpoint %v, after --leave-running %v: want the same one member", members0, now)
		}
	}
	clones := restoreClones(t, img, base, 1)
	c := clones[0]
	mark := len(a.events())
	eventually(t, 60*time.Second, "the restored copy committing transactions", func() (bool, string) {
		n := committedTxns(a.since(mark), c.PID)
		return n >= 5, fmt.Sprintf("%d committed", n)
	})
	var cAfter event
	for _, e := range of(a.since(n0), c.PID) {
		if e["ev"] == "after" {
			cAfter = e
		}
	}
	wantTxn := txn + "-" + prefix8(c.InstanceID)
	if tc.keep {
		wantTxn = txn
	}
	if cAfter.str("kind") != "restore" || cAfter.str("txn_id") != wantTxn {
		t.Fatalf("restored copy's after-restore event %v: want kind restore, transactional id %s", cAfter, wantTxn)
	}
	if tc.hold {
		// The held transaction, ended by the loop after the restore.
		var first event
		for _, e := range of(a.since(n0), c.PID) {
			if e["ev"] == "txn" || e["ev"] == "txn-error" {
				first = e
				break
			}
		}
		if first["ev"] != "txn" || first["committed"] != false || num(first["records"]) != num(held["records"]) {
			t.Errorf("the restored copy's first End %v: want the held transaction of %v records, not committed", first, held["records"])
		}
	}
	running := []kclone{c}
	if tc.leave {
		var oAfter event
		for _, e := range of(a.since(n0), pid) {
			if e["ev"] == "after" {
				oAfter = e
			}
		}
		if oAfter.str("kind") != "resume" || oAfter.str("txn_id") != txn {
			t.Fatalf("original's after-checkpoint event %v: want kind resume, transactional id %s", oAfter, txn)
		}
	}
	if tc.leave && tc.keep {
		// From the checkpoint on: the copy may fence the original before
		// restoreClones returns.
		running = kgoFenced(t, a, kclone{PID: pid, Name: "original"}, c, n0)
	} else if tc.leave {
		if !alive(pid) {
			t.Fatal("the original died after --leave-running")
		}
		running = append(running, kclone{PID: pid, Name: "original"})
	}
	time.Sleep(2 * time.Second) // under load (not an assertion)
	prod.finish()
	acks, errs := prod.snapshot()
	want := map[string]bool{}
	for x := range acks {
		want[fmt.Sprintf("%d/%d", x.p, x.o)] = true
	}
	seen := k.readCommitted(out, want)
	stopAll(t, a, running)
	var dups, extra []string
	for s, n := range seen {
		if n > 1 {
			dups = append(dups, s)
		}
		if !want[s] {
			extra = append(extra, s)
		}
	}
	aborted := 0
	for _, e := range a.events() {
		if e["ev"] == "txn" && e["committed"] == false {
			aborted++
		}
	}
	t.Logf("%d input records (%d produce errors), %d distinct on the output read_committed; %d transactions aborted by the loop",
		len(want), errs, len(seen), aborted)
	if len(dups) > 0 || len(extra) > 0 {
		t.Errorf("read_committed output: %d inputs seen more than once (%v), %d not among the inputs (%v)",
			len(dups), dups[:min(10, len(dups))], len(extra), extra[:min(10, len(extra))])
	}
	if tc.hold {
		srcs, _ := held["srcs"].([]any)
		var bad []string
		for _, s := range srcs {
			if seen[fmt.Sprint(s)] != 1 {
				bad = append(bad, fmt.Sprintf("%v seen %d times", s, seen[fmt.Sprint(s)]))
			}
		}
		t.Logf("the aborted transaction held %d inputs, e.g. %v", len(srcs), srcs[:min(5, len(srcs))])
		if len(srcs) == 0 || len(bad) > 0 {
			t.Errorf("inputs of the transaction aborted at the checkpoint, in the read_committed output: %v (want each exactly once)", bad)
		}
	}
	if tc.leave && !tc.keep && committedTxns(a.since(mark), pid) == 0 {
		t.Errorf("the original committed no transaction after resuming")
	}
}

// kgoFenced waits until exactly one of two holders of one transactional id
// was fenced (an event after skip) and stopped, checks that the other goes
// on committing, and returns the one still running.
func kgoFenced(t *testing.T, a *kapp, orig, copy kclone, skip int) []kclone {
	t.Helper()
	fencedEv := func(c kclone) event {
		for _, e := range of(a.since(skip), c.PID) {
			if e["ev"] == "fenced" {
				return e
			}
		}
		return nil
	}
	var fenced, other kclone
	eventually(t, 60*time.Second, "one of the two holders of the transactional id fenced", func() (bool, string) {
		fo, fc := fencedEv(orig), fencedEv(copy)
		switch {
		case fo != nil && fc != nil:
			t.Fatalf("both were fenced: original %v, copy %v", fo, fc)
		case fo != nil:
			fenced, other = orig, copy
		case fc != nil:
			fenced, other = copy, orig
		}
		// What each did lately, other than committing.
		last := func(c kclone) []event {
			var out []event
			for _, e := range of(a.since(skip), c.PID) {
				if e["ev"] != "txn" || e["committed"] != true {
					out = append(out, e)
				}
			}
			return tail(out, 3)
		}
		return fo != nil || fc != nil, fmt.Sprintf("original %v; copy %v", last(orig), last(copy))
	})
	t.Logf("fenced: %s (PID %d): %v", fenced.Name, fenced.PID, fencedEv(fenced))
	if fenced.PID != orig.PID {
		t.Errorf("the restored copy was fenced: want the original (the copy initializes the id last)")
	}
	eventually(t, 30*time.Second, "the fenced one to stop", func() (bool, string) {
		return count(of(a.events(), fenced.PID), "exit") > 0 && !alive(fenced.PID), ""
	})
	after := len(a.events())
	eventually(t, 60*time.Second, "the other committing after the fencing", func() (bool, string) {
		n := 0
		for _, e := range of(a.since(after), other.PID) {
			if e["ev"] == "txn" && e["committed"] == true {
				n++
			}
		}
		return n >= 5, fmt.Sprintf("%d committed", n)
	})
	return []kclone{other}
}

// kgo 4. Kafka 2 (TestKafkaConsumerGroup) with two kgo group members
// (kgohooks.Client): the checkpointed one leaves the group, the other takes
// its partitions, no committed offset goes back, every record is
// processed, and the restored member rejoins under a new client id.
func TestKgoConsumerGroup(t *testing.T) {
	testConsumerGroup(t, kgoBin, func(string) string { return "kgo/member-a" })
}
