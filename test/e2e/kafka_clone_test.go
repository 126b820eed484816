package e2e

// Kafka end-to-end tests of clones: kafkaapp started with kcr run
// (init of its own PID namespace), checkpointed, and restored three times at
// once with kcr restore --count 3. The clones append to one event log; each
// event carries the host PID of the clone that logged it ("hpid"), and each
// record kafkaapp writes carries the instance id and host PID of its writer
// in headers, so events and records are told apart per clone. What is on
// the broker is checked with the test's own franz-go client.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// kclone is one clone of kcr restore --count N --json.
type kclone struct {
	PID        int    `json:"pid"`
	Name       string `json:"name"`
	Generation uint64 `json:"generation"`
	InstanceID string `json:"instance_id"`
	Pending    bool   `json:"hooks_pending"`
}

// run starts kafkaapp with kcr run and returns its host PID; the returned
// kapp reads the log that it and every clone of it append to.
func (k *kafkaEnv) run(args ...string) (int, *kapp) {
	k.t.Helper()
	return k.runBin(kafkaBin, args...)
}

// runBin is run for bin (kafkaapp or kgoapp).
func (k *kafkaEnv) runBin(bin string, args ...string) (int, *kapp) {
	t := k.t
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "app.log")
	r := runKCR(t, kcrOpts{must: true}, append([]string{"run", "--json", "--log", log, "-e", "KCR_SOCKET_DIR=" + filepath.Join(dir, "sock"),
		"--", bin, "-brokers", k.brokers}, args...)...)
	var out struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.PID == 0 {
		t.Fatalf("kcr run --json: %v %q", err, r.stdout)
	}
	t.Cleanup(func() { killWait(out.PID) })
	a := &kapp{app: &app{t: t, pid: out.PID, out: log}, k: k}
	k.keepLog(a)
	ev := a.waitEvent(10*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		t.Fatalf("kafkaapp failed to start: %v", ev)
	}
	a.listen, a.sock = ev.str("listen"), ev.str("socket")
	return out.PID, a
}

// checkpointGone checkpoints pid (which kcr stops), with extra flags, into
// a new image and waits until it is gone.
func checkpointGone(t *testing.T, pid int, extra ...string) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, append(append([]string{"checkpoint", "-o", img}, extra...), strconv.Itoa(pid))...)
	eventually(t, 10*time.Second, "the checkpointed process to be gone", func() (bool, string) {
		return !alive(pid), fmt.Sprintf("PID %d still running", pid)
	})
	return img
}

// restoreClones restores n clones of img, killed at cleanup, and checks
// that they run side by side, each init of its own PID namespace with its
// own host PID, generation and instance id, its hooks done. A consumer's
// image usually had records in the application's hands (kafkaapp batches
// them before it processes them), which every clone processes: such
// restores need --allow-duplicates, which these tests accept.
func restoreClones(t *testing.T, img, name string, n int) []kclone {
	t.Helper()
	r := runKCR(t, kcrOpts{must: true}, "restore", "--json", "--allow-duplicates", "--count", strconv.Itoa(n), "--name", name, img)
	var doc struct {
		Restores []kclone `json:"restores"`
	}
	err := json.Unmarshal([]byte(r.stdout), &doc)
	clones := doc.Restores
	if err != nil || len(clones) != n {
		t.Fatalf("kcr restore --count %d --json: %v: %q", n, err, r.stdout)
	}
	for _, c := range clones {
		t.Cleanup(func() { killWait(c.PID) })
	}
	if len(clones) != n {
		t.Fatalf("kcr restore --count %d restored %d clones: %q", n, len(clones), r.stdout)
	}
	pids, gens, ids := map[int]bool{}, map[uint64]bool{}, map[string]bool{}
	for _, c := range clones {
		pids[c.PID], gens[c.Generation], ids[c.InstanceID] = true, true, true
		if c.Pending || c.InstanceID == "" || !alive(c.PID) {
			t.Fatalf("clone %+v: not running or its hooks not done", c)
		}
		status, _ := os.ReadFile("/proc/" + strconv.Itoa(c.PID) + "/status")
		if !strings.Contains(string(status), "NSpid:\t"+strconv.Itoa(c.PID)+"\t1\n") {
			t.Fatalf("clone %d is not init of its own PID namespace:\n%s", c.PID, status)
		}
	}
	if len(pids) != n || len(gens) != n || len(ids) != n {
		t.Fatalf("clones share identity: %+v", clones)
	}
	return clones
}

// clientOf is the Kafka client id kafkahooks gives a clone.
func clientOf(base string, c kclone) string { return base + "-" + prefix8(c.InstanceID) }

// of returns the events logged by the process with host PID hpid.
func of(evs []event, hpid int) []event {
	var out []event
	for _, e := range evs {
		if int(num(e["hpid"])) == hpid {
			out = append(out, e)
		}
	}
	return out
}

// checkAfter asserts each clone's after-restore event: its own instance id,
// generation and client ids.
func checkAfter(t *testing.T, a *kapp, base string, clones []kclone, writer bool) {
	t.Helper()
	for _, c := range clones {
		var ev event
		eventually(t, 30*time.Second, fmt.Sprintf("the after-restore event of clone %d", c.PID), func() (bool, string) {
			var seen []float64
			for _, e := range a.events() {
				if e["ev"] == "after" && int(num(e["hpid"])) == c.PID {
					ev = e
					return true, ""
				} else if e["ev"] == "after" {
					seen = append(seen, num(e["hpid"]))
				}
			}
			return false, fmt.Sprintf("after-restore events logged by host PIDs %v", seen)
		})
		want := clientOf(base, c)
		wantW := ""
		if writer {
			wantW = want
		}
		if ev.str("kind") != "restore" || ev.str("instance") != c.InstanceID || uint64(num(ev["gen"])) != c.Generation ||
			ev.str("reader_client") != want || ev.str("writer_client") != wantW {
			t.Fatalf("clone %s (PID %d) after-restore event %v: want instance %s, generation %d, client ids %s",
				c.Name, c.PID, ev, c.InstanceID, c.Generation, want)
		}
	}
}

// stopAll sends SIGTERM to every clone and waits until each logged its exit
// (everything flushed and closed) and is gone.
func stopAll(t *testing.T, a *kapp, clones []kclone) {
	t.Helper()
	for _, c := range clones {
		syscall.Kill(c.PID, syscall.SIGTERM)
	}
	eventually(t, 60*time.Second, "every clone to exit after SIGTERM", func() (bool, string) {
		var left []int
		for _, c := range clones {
			if count(of(a.events(), c.PID), "exit") == 0 || alive(c.PID) {
				left = append(left, c.PID)
			}
		}
		return len(left) == 0, fmt.Sprintf("still running or not exited: %v", left)
	})
	for _, c := range clones {
		for _, e := range of(a.events(), c.PID) {
			if e["ev"] == "exit" {
				t.Logf("clone %s (PID %d) exit: acked %v processed %v pending %v writer_close %q reader_close %q",
					c.Name, c.PID, e["acked"], e["processed"], e["pending"], e.str("writer_close"), e.str("reader_close"))
			}
		}
	}
}

// Clones 1. A service that produces numbered records to a 6-partition topic
// and consumes it as a member of a group, started with kcr run and
// checkpointed, is restored as three clones. They run side by side; the
// broker lists three members of the group with three client ids, those of
// the clones' instance ids, sharing the partitions; each clone's acknowledged
// records grow and each processes records. The clones continue from the
// same record counter, so their numbers collide: records are attributed by
// their writer's host PID header, and every record each clone (and the
// original) saw acknowledged is on the topic.
func TestKafkaRunClones(t *testing.T) {
	k := needKafka(t)
	start := time.Now()
	const parts = 6
	topic := k.newTopic("runclones", parts)
	group := uniqueName("runclones")
	const base = "rc"
	pid, a := k.run("-topic", topic, "-group", group, "-consume", "-produce-rate", "100", "-client-id", base)
	a.waitAcked(100, 30*time.Second)
	a.waitProcessed(0, 50, 30*time.Second)

	n0 := len(a.events())
	img := checkpointGone(t, pid)
	orig := acked(of(a.events(), pid))
	pending, _ := a.pendingAt(n0)
	t.Logf("the original (PID %d) saw %d records acknowledged, had %d in hand at the checkpoint (%s)",
		pid, len(orig), len(pending), runsOf(pending, 10))

	n1 := len(a.events())
	tr := time.Now()
	clones := restoreClones(t, img, base, 3)
	restoreTook := time.Since(tr)
	checkAfter(t, a, base, clones, true)

	v := k.waitClonesShare(group, topic, parts, base, clones)
	stable := time.Since(tr)
	t.Logf("kcr restore --count 3 took %v; the broker lists %v %v after it started", restoreTook.Round(time.Millisecond), v, stable.Round(time.Millisecond))

	// Each clone produces and consumes: its acknowledged and processed
	// records grow from here on.
	mark := len(a.events())
	eventually(t, 40*time.Second, "every clone producing and consuming", func() (bool, string) {
		evs := a.since(mark)
		ok := true
		var s []string
		for _, c := range clones {
			ac, pr := len(acked(of(evs, c.PID))), len(processed(of(evs, c.PID)))
			ok = ok && ac >= 200 && pr >= 50
			s = append(s, fmt.Sprintf("%s: %d acknowledged, %d processed", c.Name, ac, pr))
		}
		return ok, strings.Join(s, "; ")
	})
	for _, c := range clones {
		if !alive(c.PID) {
			t.Fatalf("clone %s (PID %d) died", c.Name, c.PID)
		}
	}
	stopAll(t, a, clones)

	// Attribute every acknowledgment to the process that logged it and to
	// the record it acknowledged: (writer's host PID, number).
	type rec struct{ hpid, n int }
	ackedBy := map[int]map[rec]int{}
	total := map[rec]int{}
	for _, e := range a.events() {
		if e["ev"] != "acked" {
			continue
		}
		by, rh := int(num(e["hpid"])), int(num(e["rhpid"]))
		if ackedBy[by] == nil {
			ackedBy[by] = map[rec]int{}
		}
		for n := int(num(e["from"])); n <= int(num(e["to"])); n++ {
			ackedBy[by][rec{rh, n}]++
			total[rec{rh, n}]++
		}
	}
	recs := k.readTopic(topic)
	on := map[rec]int{}
	writers := map[int]map[int]bool{} // number → host PIDs that wrote it
	insts := map[string]int{}
	for _, r := range recs {
		on[rec{r.hpid, r.n}]++
		if writers[r.n] == nil {
			writers[r.n] = map[int]bool{}
		}
		writers[r.n][r.hpid] = true
		insts[r.inst]++
	}
	if on[rec{0, 0}] > 0 || insts[""] > 0 {
		t.Errorf("%d records without the hpid header, %d without the inst header", on[rec{0, 0}], insts[""])
	}
	// A record the original built and handed to its Writer before the
	// checkpoint (held at the Writer's gate, or carried in the image) is
	// written by every clone: expected duplicates. Others come from retries.
	dupOrig, dupClone, collide := 0, 0, 0
	for r, c := range on {
		if r.hpid == pid {
			dupOrig += c - 1
		} else {
			dupClone += c - 1
		}
	}
	for _, w := range writers {
		if len(w) > 1 {
			collide++
		}
	}
	t.Logf("topic %s: %d records; %d numbers written by more than one process (the clones share the counter); duplicates of one writer's record: %d of records the original built before the checkpoint (one copy per clone), %d of the clones' own",
		topic, len(recs), collide, dupOrig, dupClone)
	origInst := ""
	for _, r := range recs {
		if r.hpid == pid {
			origInst = r.inst
		}
	}
	procs := []kclone{{PID: pid, Name: "original", InstanceID: origInst}}
	for _, p := range append(procs, clones...) {
		mine := ackedBy[p.PID]
		var missing []int
		own, again := 0, 0
		for r, c := range mine {
			if r.hpid == p.PID {
				own++
			}
			if on[r] < total[r] {
				missing = append(missing, r.n)
			}
			again += c - 1
		}
		var nums []int
		for r := range mine {
			nums = append(nums, r.n)
		}
		pr := processed(of(a.events(), p.PID))
		t.Logf("%s (PID %d, instance %s): %d records acknowledged (%d built by itself, %d acknowledged more than once, numbers %s), %d records with its instance id on the topic, %d processed",
			p.Name, p.PID, p.InstanceID, len(mine), own, again, runsOf(nums, 6), insts[p.InstanceID], len(pr))
		if len(mine) == 0 || len(pr) == 0 {
			t.Errorf("%s (PID %d) acknowledged %d records and processed %d", p.Name, p.PID, len(mine), len(pr))
		}
		if p.InstanceID != "" && insts[p.InstanceID] == 0 {
			t.Errorf("%s: no record on the topic carries its instance id %s", p.Name, p.InstanceID)
		}
		if len(missing) > 0 {
			t.Errorf("%s (PID %d): %d records it saw acknowledged are missing from the topic: %s", p.Name, p.PID, len(missing), runsOf(missing, 20))
		}
	}
	// Acknowledged after the restore but built before it: records the
	// original had in hand, written once by each clone.
	carried := 0
	for r, c := range total {
		if r.hpid == pid && c > 1 {
			carried++
		}
	}
	t.Logf("%d records built by the original were acknowledged to more than one process; events after the restore: %d; test took %v",
		carried, len(a.events())-n1, time.Since(start).Round(time.Millisecond))
}

// Clones 2. Three clones consume a 6-partition topic as one group while the
// test produces to it. One is killed (SIGKILL): once the broker's session
// timeout (6 s) expires, the other two hold all 6 partitions, and nothing is
// lost: every record produced is processed by some clone, and the group's
// committed offsets reach the end of every partition without going back.
func TestKafkaCloneKilled(t *testing.T) {
	k := needKafka(t)
	start := time.Now()
	const parts = 6
	const session = 6 * time.Second
	topic := k.newTopic("clonekill", parts)
	group := uniqueName("clonekill")
	const base = "ck"
	prod := k.produce(topic, 100)
	pid, a := k.run("-topic", topic, "-group", group, "-consume", "-client-id", base, "-session-timeout", session.String())
	a.waitProcessed(0, 50, 30*time.Second)
	img := checkpointGone(t, pid)

	clones := restoreClones(t, img, base, 3)
	checkAfter(t, a, base, clones, false)
	v := k.waitClonesShare(group, topic, parts, base, clones)
	t.Logf("the group: %v", v)
	mark := len(a.events())
	eventually(t, 30*time.Second, "every clone processing records", func() (bool, string) {
		ok := true
		var s []string
		for _, c := range clones {
			n := len(processed(of(a.since(mark), c.PID)))
			ok = ok && n > 0
			s = append(s, fmt.Sprintf("%s: %d", c.Name, n))
		}
		return ok, strings.Join(s, ", ")
	})
	watch := k.watchCommits(group, topic)

	victim, rest := clones[0], clones[1:]
	lost := v.assigned[clientOf(base, victim)]
	var survivors []string
	for _, c := range rest {
		survivors = append(survivors, clientOf(base, c))
	}
	sort.Strings(survivors)
	nk := len(a.events())
	syscall.Kill(victim.PID, syscall.SIGKILL)
	tk := time.Now()
	killWait(victim.PID)
	v = k.waitGroup(group, topic, 30*time.Second, "the two survivors "+fmt.Sprint(survivors)+" holding all partitions", func(v groupView) bool {
		return v.state == "Stable" && slices.Equal(v.clients, survivors) && len(v.all) == parts &&
			len(v.assigned[survivors[0]]) > 0 && len(v.assigned[survivors[1]]) > 0
	})
	moved := time.Since(tk)
	// The victim's partitions are processed again, by the survivors.
	eventually(t, 30*time.Second, "the survivors processing records of the killed clone's partitions "+fmt.Sprint(lost), func() (bool, string) {
		got := map[int32]bool{}
		for _, c := range rest {
			for x := range processed(of(a.since(nk), c.PID)) {
				got[x.p] = true
			}
		}
		var miss []int32
		for _, p := range lost {
			if !got[p] {
				miss = append(miss, p)
			}
		}
		return len(miss) == 0, fmt.Sprintf("not yet: %v", miss)
	})
	resumed := time.Since(tk)
	t.Logf("killed %s (PID %d, partitions %v): the broker listed %v %v later; its partitions processed again after %v",
		victim.Name, victim.PID, lost, v, moved.Round(time.Millisecond), resumed.Round(time.Millisecond))
	if moved > session+10*time.Second {
		t.Errorf("the partitions took %v to move; want about the session timeout (%v)", moved, session)
	}

	time.Sleep(time.Second) // some more records for the two survivors (not an assertion)
	prod.finish()
	produced, perrs := prod.snapshot()
	ends := k.endOffsets(topic)
	k.waitCommitted(group, topic, ends, 60*time.Second)
	regressions, polls, last := watch()
	t.Logf("%d records produced (%d errors), end offsets %v; committed offsets polled %d times, last %v", len(produced), perrs, ends, polls, last)
	for _, r := range regressions {
		t.Errorf("a committed offset went back: %s", r)
	}
	checkProcessed(t, ends, produced, map[string]*kapp{"clones": a})
	per := map[string]int{}
	for _, c := range clones {
		per[c.Name] = len(processed(of(a.events(), c.PID)))
	}
	t.Logf("processed per clone %v, %d commit errors; test took %v", per, count(a.events(), "commit-error"), time.Since(start).Round(time.Millisecond))
	stopAll(t, a, rest)
}

// waitClonesShare waits until the group is stable with the clones (client
// ids from base) as its only members, each assigned some of the topic's
// parts partitions, and returns what the broker showed.
func (k *kafkaEnv) waitClonesShare(group, topic string, parts int, base string, clones []kclone) groupView {
	k.t.Helper()
	var want []string
	for _, c := range clones {
		want = append(want, clientOf(base, c))
	}
	sort.Strings(want)
	return k.waitGroup(group, topic, 60*time.Second, fmt.Sprintf("%d members %v sharing the partitions", len(want), want), func(v groupView) bool {
		if v.state != "Stable" || !slices.Equal(v.clients, want) || len(v.all) != parts {
			return false
		}
		for _, c := range want {
			if len(v.assigned[c]) == 0 {
				return false
			}
		}
		return true
	})
}
