package e2e

// Kafka end-to-end tests: kafkaapp, a Go service whose kafka-go
// clients are kafkahooks wrappers, checkpointed and restored by kcr on real
// CRIU, against a real Apache Kafka broker ($KCR_KAFKA_BROKERS, started by
// scripts/kafka-up.sh). What is on the broker is checked with a franz-go
// client of the test's own, never on the app's word.
//
// The tests run one at a time (go test -p 1) and take about 2 minutes.
// TestKafkaBrokerDownDuringRestore stops and restarts the broker with
// scripts/kafka-down.sh and scripts/kafka-up.sh (KCR_KAFKA_KEEP_DATA=1); the
// carried-* subtests and it freeze the broker's JVM (SIGSTOP) for a second
// or two. Both need the broker of scripts/kafka-up.sh ($KCR_KAFKA_HOME).
// KCR_E2E_KEEP_LOGS=DIR keeps kafkaapp's event logs.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Kafka 1. A producer under load (200 records/s) is checkpointed mid-stream
// and restored: every record it saw acknowledged is on the topic, and the
// records it had in hand at the checkpoint are acknowledged after the
// restore. With the broker frozen (SIGSTOP) during the hooks, the Writer
// cannot drain within the budget: records are carried in the image
// (manifest) and delivered after the restore.
func TestKafkaProducerCheckpoint(t *testing.T) {
	for _, c := range []struct {
		name         string
		async, carry bool
	}{
		{"sync", false, false},
		{"async", true, false},
		{"carried-sync", false, true},
		{"carried-async", true, true},
	} {
		t.Run(c.name, func(t *testing.T) { testProducerCheckpoint(t, c.async, c.carry) })
	}
}

func testProducerCheckpoint(t *testing.T, async, carry bool) {
	k := needKafka(t)
	if carry {
		k.brokerPID()
	}
	topic := k.newTopic("produce", 3)
	args := []string{"-topic", topic, "-produce-rate", "200", "-client-id", "prod"}
	if async {
		args = append(args, "-async")
	}
	a := k.start(args...)
	a.waitAcked(300, 30*time.Second)

	img := filepath.Join(t.TempDir(), "img")
	n0 := len(a.events())
	if carry {
		k.checkpointBrokerStopped(a, img)
	} else {
		runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpointed process is still running")
	}
	before := acked(a.events())
	pending, _ := a.pendingAt(n0)
	w := manifestResource(t, img, "kafka-writer/"+topic)
	carried := int(num(w["records_carried"]))
	t.Logf("at the checkpoint: %d records acknowledged, %d in the app's hands (%s); writer report in the manifest: %v",
		len(before), len(pending), runsOf(pending, 10), w)
	if carry {
		if carried <= 0 || w["drained"] != false {
			t.Fatalf("writer report %v: want records_carried > 0 and drained=false with the broker stopped", w)
		}
		if len(pending) < carried {
			t.Fatalf("the app had %d records in hand, fewer than the %d the Writer reports carried", len(pending), carried)
		}
	} else if w["drained"] != true {
		t.Errorf("writer report %v: want drained=true", w)
	}

	n1 := len(a.events())
	pid, out := restore(t, img)
	if pid != a.pid || out["hooks_pending"] != false {
		t.Fatalf("restore: pid %d (want %d), hooks_pending %v", pid, a.pid, out["hooks_pending"])
	}
	if carry {
		// The Writer's after-restore report, as kcr restore got it.
		rep := restoreReport(out, "kafka-writer/"+topic)
		t.Logf("writer after-restore report: %v", rep)
		if int(num(rep["records_carried"])) != carried || num(rep["records_delivered"]) != num(rep["records_carried"]) || rep["gate_open"] != true {
			t.Errorf("writer after-restore report %v: want the %d carried records delivered and the gate open", rep, carried)
		}
	}
	inst, _ := out["instance_id"].(string)
	ev := a.waitAfter(n1, 30*time.Second)
	if want := "prod-" + prefix8(inst); ev.str("kind") != "restore" || ev.str("instance") != inst || ev.str("writer_client") != want {
		t.Fatalf("after-restore event %v: want kind restore, instance %s, writer client id %s", ev, inst, want)
	}
	d := a.waitRecordsAcked(n1, pending, 30*time.Second, "the records in hand at the checkpoint acknowledged after the restore")
	t.Logf("the %d records in hand at the checkpoint (%d carried in the image) were acknowledged %v after the restore hooks",
		len(pending), carried, d.Round(time.Millisecond))
	a.waitAcked(len(before)+300, 30*time.Second)
	a.stop(pid)

	all := acked(a.events())
	again := 0
	for _, c := range all {
		again += c - 1
	}
	t.Logf("the app saw %d records acknowledged (%d acknowledged more than once), %d write errors", len(all), again, count(a.events(), "write-error"))
	k.checkAcked(topic, all)
}

// Kafka 2. Two members of one group share a 3-partition topic that the test
// feeds. One is checkpointed: it leaves the group and the other takes over
// all partitions within seconds. Restored, it rejoins under a new client id.
// No committed offset ever goes back, and every record is processed.
func TestKafkaConsumerGroup(t *testing.T) {
	testConsumerGroup(t, kafkaBin, func(group string) string { return "kafka-reader/" + group })
}

// testConsumerGroup is Kafka 2 for bin (kafkaapp or kgoapp), whose consumer
// registers as resource(group) with clients member-a and member-b.
func testConsumerGroup(t *testing.T, bin string, resource func(group string) string) {
	k := needKafka(t)
	topic, group, prod := k.groupTopic("group", 3, 100)
	member := func(id string) []string {
		return []string{"-topic", topic, "-group", group, "-consume", "-client-id", id}
	}
	a := k.startBin(bin, member("member-a")...)
	b := k.startBin(bin, member("member-b")...)
	k.waitGroup(group, topic, 60*time.Second, "two members sharing the 3 partitions", func(v groupView) bool {
		return v.state == "Stable" && slices.Equal(v.clients, []string{"member-a", "member-b"}) && len(v.all) == 3 &&
			len(v.assigned["member-a"]) > 0 && len(v.assigned["member-b"]) > 0
	})
	a.waitProcessed(0, 1, 30*time.Second)
	b.waitProcessed(0, 1, 30*time.Second)
	watch := k.watchCommits(group, topic)

	img := filepath.Join(t.TempDir(), "img")
	nb := len(b.events())
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	tck := time.Now()
	<-a.done
	rep := manifestResource(t, img, resource(group))
	t.Logf("reader report in the manifest: %v", rep)
	if rep["left_group"] != true {
		t.Errorf("reader report %v: want left_group=true", rep)
	}
	k.waitGroup(group, topic, 30*time.Second, "member-b alone with all 3 partitions", func(v groupView) bool {
		return v.state == "Stable" && slices.Equal(v.clients, []string{"member-b"}) && len(v.assigned["member-b"]) == 3
	})
	takeover := time.Since(tck)
	eventually(t, 30*time.Second, "member-b processing records of all 3 partitions", func() (bool, string) {
		parts := map[int32]bool{}
		for x := range processed(b.since(nb)) {
			parts[x.p] = true
		}
		return len(parts) == 3, fmt.Sprintf("partitions %v", parts)
	})
	t.Logf("member-b held all 3 partitions %v after the checkpoint", takeover.Round(time.Millisecond))
	if takeover > 10*time.Second {
		t.Errorf("member-b took %v to get all partitions; want a few seconds (the checkpointed member leaves the group)", takeover)
	}

	na := len(a.events())
	pid, out := restore(t, img)
	tr := time.Now()
	inst, _ := out["instance_id"].(string)
	want := "member-a-" + prefix8(inst)
	k.waitGroup(group, topic, 60*time.Second, "the restored member rejoining as "+want, func(v groupView) bool {
		clients := []string{want, "member-b"}
		sort.Strings(clients)
		return v.state == "Stable" && slices.Equal(v.clients, clients) && len(v.all) == 3 && len(v.assigned[want]) > 0
	})
	rejoin := time.Since(tr)
	t.Logf("the restored member was back in the group as %s %v after kcr restore returned", want, rejoin.Round(time.Millisecond))
	if ev := a.waitAfter(na, 30*time.Second); ev.str("kind") != "restore" || ev.str("reader_client") != want {
		t.Fatalf("after-restore event %v: want kind restore, reader client id %s", ev, want)
	}
	a.waitProcessed(na, 20, 30*time.Second)

	prod.finish()
	produced, perrs := prod.snapshot()
	ends := k.endOffsets(topic)
	k.waitCommitted(group, topic, ends, 60*time.Second)
	regressions, polls, last := watch()
	t.Logf("committed offsets polled %d times, last %v; %d records produced (%d errors), end offsets %v", polls, last, len(produced), perrs, ends)
	if polls < 5 {
		t.Errorf("committed offsets polled only %d times", polls)
	}
	for _, r := range regressions {
		t.Errorf("a committed offset went back: %s", r)
	}
	checkProcessed(t, ends, produced, map[string]*kapp{"member-a": a, "member-b": b})
	a.stop(pid)
	b.stop(b.pid)
}

// checkProcessed asserts that every offset below ends (which include every
// produced record) was processed by one of the apps, and logs how many were
// processed more than once.
func checkProcessed(t *testing.T, ends map[int32]int64, produced map[po]int, apps map[string]*kapp) {
	t.Helper()
	var union map[po]int
	per := map[string]int{}
	var missing []po
	eventually(t, 10*time.Second, "every record processed", func() (bool, string) {
		union = map[po]int{}
		for name, a := range apps {
			p := processed(a.events())
			per[name] = len(p)
			for x, c := range p {
				union[x] += c
			}
		}
		missing = missing[:0]
		for p, e := range ends {
			for o := int64(0); o < e; o++ {
				if union[po{p, o}] == 0 {
					missing = append(missing, po{p, o})
				}
			}
		}
		for x := range produced {
			if union[x] == 0 && x.o >= ends[x.p] {
				missing = append(missing, x)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d not processed, e.g. %v", len(missing), missing[:min(len(missing), 10)])
	})
	again := 0
	for _, c := range union {
		again += c - 1
	}
	t.Logf("%d distinct records processed (per app %v), %d processed again after a checkpoint or rebalance", len(union), per, again)
}

// watchCommits polls the group's committed offsets every 100 ms until the
// returned function is called, which says each time one went back.
func (k *kafkaEnv) watchCommits(group, topic string) func() (regressions []string, polls int, last map[int32]int64) {
	stop, done := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	high := map[int32]int64{}
	var regs []string
	n := 0
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			c, err := k.committed(group, topic)
			if err != nil {
				continue
			}
			mu.Lock()
			n++
			for p, o := range c {
				if h, ok := high[p]; ok && o < h {
					regs = append(regs, fmt.Sprintf("partition %d: %d after %d (at %s)", p, o, h, time.Now().Format("15:04:05.000")))
				}
				high[p] = max(high[p], o)
			}
			mu.Unlock()
		}
	}()
	var once sync.Once
	stopFn := func() {
		once.Do(func() { close(stop); <-done })
	}
	k.t.Cleanup(stopFn)
	return func() ([]string, int, map[int32]int64) {
		stopFn()
		mu.Lock()
		defer mu.Unlock()
		return regs, n, high
	}
}

// Kafka 3. One image restored twice, the second after the first was killed:
// the broker sees each clone as a group member with its own client id.
func TestKafkaClones(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("clones", 3)
	group := uniqueName("clones")
	k.produce(topic, 50)
	a := k.start("-topic", topic, "-group", group, "-consume", "-client-id", "clone")
	k.waitGroup(group, topic, 60*time.Second, "the original in the group as clone", func(v groupView) bool {
		return v.state == "Stable" && slices.Equal(v.clients, []string{"clone"})
	})
	a.waitProcessed(0, 1, 30*time.Second)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done

	seen := []string{"clone"}
	var pids []int
	for i := 1; i <= 2; i++ {
		n := len(a.events())
		pid, out := restore(t, img)
		pids = append(pids, pid)
		inst, _ := out["instance_id"].(string)
		want := "clone-" + prefix8(inst)
		if slices.Contains(seen, want) {
			t.Fatalf("clone %d got client id %s, which the broker saw before (%v)", i, want, seen)
		}
		v := k.waitGroup(group, topic, 60*time.Second, fmt.Sprintf("clone %d in the group as %s", i, want), func(v groupView) bool {
			return v.state == "Stable" && slices.Equal(v.clients, []string{want}) && len(v.assigned[want]) == 3
		})
		t.Logf("clone %d (instance %s): the broker lists the group's member as %v (host %s)", i, inst, v.clients, v.raw[0].ClientHost)
		if ev := a.waitAfter(n, 30*time.Second); ev.str("reader_client") != want || ev.str("instance") != inst {
			t.Fatalf("clone %d after-restore event %v: want reader client id %s", i, ev, want)
		}
		a.waitProcessed(n, 1, 30*time.Second)
		seen = append(seen, want)
		if i == 1 {
			killWait(pid)
		}
	}
	if pids[0] != pids[1] || pids[0] != a.pid {
		t.Errorf("clones restored as PIDs %v, want the original %d", pids, a.pid)
	}
	t.Logf("client ids the broker saw: %v", seen)
}

// Kafka 4. The broker is down when the image is restored: kcr restore
// --wait 3s reports the hooks as pending and exits 0 instead of hanging; the
// app resends the carried records with backoff; once the broker is back
// (same data) it carries on, and no acknowledged record is lost.
func TestKafkaBrokerDownDuringRestore(t *testing.T) {
	k := needKafka(t)
	k.restartsBroker()
	topic := k.newTopic("down", 3)
	group := uniqueName("down")
	a := k.start("-topic", topic, "-group", group, "-consume", "-produce-rate", "100", "-client-id", "down", "-log-level", "debug")
	a.waitAcked(200, 30*time.Second)
	a.waitProcessed(0, 100, 30*time.Second)

	img := filepath.Join(t.TempDir(), "img")
	n0 := len(a.events())
	k.checkpointBrokerStopped(a, img)
	<-a.done
	before := acked(a.events())
	pending, _ := a.pendingAt(n0)
	w := manifestResource(t, img, "kafka-writer/"+topic)
	t.Logf("at the checkpoint: %d records acknowledged, %d in the app's hands; writer report %v", len(before), len(pending), w)
	if num(w["records_carried"]) <= 0 {
		t.Fatalf("writer report %v: want records carried in the image", w)
	}
	script(t, "kafka-down.sh")
	tdown := time.Now()

	n1 := len(a.events())
	t0 := time.Now()
	r := runKCR(t, kcrOpts{must: true}, "restore", "--json", "--wait", "3s", img)
	took := time.Since(t0)
	out := oneRestore(t, r.stdout)
	pid := int(num(out["pid"]))
	t.Cleanup(func() { killWait(pid) })
	inst, _ := out["instance_id"].(string)
	t.Logf("kcr restore with the broker down returned after %v: hooks_pending=%v", took.Round(time.Millisecond), out["hooks_pending"])
	if out["hooks_pending"] != true {
		t.Fatalf("kcr restore --wait 3s with the broker down: hooks_pending=%v, want true", out["hooks_pending"])
	}
	if took > 15*time.Second {
		t.Errorf("kcr restore --wait 3s took %v", took)
	}
	if !alive(pid) {
		t.Fatal("the restored app died")
	}
	var backoffs []float64
	eventually(t, 30*time.Second, "the restored app resending the carried records with backoff", func() (bool, string) {
		backoffs = backoffs[:0]
		for _, e := range a.since(n1) {
			if e["ev"] == "log" && e.str("msg") == "resending records held across a checkpoint" {
				backoffs = append(backoffs, num(e["backoff"]))
			}
		}
		return len(backoffs) >= 3, fmt.Sprintf("%d resends logged", len(backoffs))
	})
	if slices.Max(backoffs) <= slices.Min(backoffs) {
		t.Errorf("backoffs between resends %v: want growing", backoffs)
	}
	if c := count(a.since(n1), "after"); c != 0 || len(acked(a.since(n1))) != 0 {
		t.Fatalf("with the broker down: %d after-restore events, %d records acknowledged", c, len(acked(a.since(n1))))
	}
	script(t, "kafka-up.sh", "KCR_KAFKA_KEEP_DATA=1")
	down := time.Since(tdown)
	tup := time.Now()

	// kcr did not wait for the hooks, so the instance id is the app's word.
	ev := a.waitAfter(n1, 60*time.Second)
	if inst == "" {
		inst = ev.str("instance")
	}
	if want := "down-" + prefix8(inst); ev.str("kind") != "restore" || inst == "" || ev.str("instance") != inst ||
		num(ev["gen"]) != num(out["generation"]) || ev.str("writer_client") != want || ev.str("reader_client") != want {
		t.Fatalf("after-restore event %v: want kind restore, generation %v, client ids %s", ev, out["generation"], want)
	}
	a.waitRecordsAcked(n1, pending, 60*time.Second, "the records in hand at the checkpoint acknowledged")
	t.Logf("%d resends logged while the broker was down (backoffs %v ns; down for %v); the %d records in hand at the checkpoint were acknowledged %v after the broker was back",
		len(backoffs), backoffs, down.Round(time.Millisecond), len(pending), time.Since(tup).Round(time.Millisecond))
	a.waitAcked(len(before)+len(pending)+200, 60*time.Second)
	a.waitProcessed(n1, 100, 60*time.Second)
	a.stop(pid)
	k.checkAcked(topic, acked(a.events()))
}

// Kafka 5. 100 checkpoint/resume cycles (--leave-running, each image
// deleted) of an app that produces and consumes: no fd or goroutine leaks,
// client ids unchanged (resume), nothing acknowledged lost, everything
// processed.
func TestKafkaCheckpointCycles(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("cycles", 3)
	group := uniqueName("cycles")
	a := k.start("-topic", topic, "-group", group, "-consume", "-produce-rate", "200", "-client-id", "cyc")
	a.waitAcked(400, 30*time.Second)
	a.waitProcessed(0, 200, 30*time.Second)
	base := a.state()
	for i := 0; i < 4; i++ {
		time.Sleep(100 * time.Millisecond)
		s := a.state()
		base.Goroutines, base.FDs = max(base.Goroutines, s.Goroutines), max(base.FDs, s.FDs)
	}

	const cycles = 100
	dir := t.TempDir()
	var durs []time.Duration
	start := time.Now()
	for i := 0; i < cycles; i++ {
		img := filepath.Join(dir, fmt.Sprintf("img-%03d", i))
		c0 := time.Now()
		if r := runKCR(t, kcrOpts{log: logFailed}, "checkpoint", "--leave-running", "-o", img, strconv.Itoa(a.pid)); r.code != 0 {
			t.Fatalf("cycle %d: kcr checkpoint exit %d: %s", i, r.code, r.stderr)
		}
		durs = append(durs, time.Since(c0))
		if err := os.RemoveAll(img); err != nil {
			t.Fatal(err)
		}
		if !alive(a.pid) {
			t.Fatalf("cycle %d: the app died", i)
		}
	}
	total := time.Since(start)
	slices.Sort(durs)
	t.Logf("%d cycles in %v: checkpoint --leave-running min %v, median %v, max %v", cycles, total.Round(time.Millisecond),
		durs[0].Round(time.Millisecond), durs[len(durs)/2].Round(time.Millisecond), durs[len(durs)-1].Round(time.Millisecond))

	evs := a.events()
	resumes := 0
	for _, e := range evs {
		if e["ev"] != "after" {
			continue
		}
		resumes++
		if e.str("kind") != "resume" || e.str("writer_client") != "cyc" || e.str("reader_client") != "cyc" {
			t.Fatalf("after-checkpoint event %v: want kind resume and client ids unchanged (cyc)", e)
		}
	}
	if resumes != cycles {
		t.Fatalf("%d resume events, want %d", resumes, cycles)
	}
	n := len(evs)
	a.waitAcked(len(acked(evs))+200, 30*time.Second)
	a.waitProcessed(n, 100, 30*time.Second)

	var s appState
	settle := eventually(t, 30*time.Second, "goroutine and fd counts back to where they were", func() (bool, string) {
		s = a.state()
		return s.Goroutines <= base.Goroutines+10 && s.FDs <= base.FDs+3,
			fmt.Sprintf("goroutines %d (before %d), fds %d (before %d)", s.Goroutines, base.Goroutines, s.FDs, base.FDs)
	})
	t.Logf("before the cycles: %d goroutines, %d fds; after: %d goroutines, %d fds (settled in %v)",
		base.Goroutines, base.FDs, s.Goroutines, s.FDs, settle.Round(time.Millisecond))

	ends := k.endOffsets(topic)
	k.waitCommitted(group, topic, ends, 60*time.Second)
	checkProcessed(t, ends, nil, map[string]*kapp{"cyc": a})
	a.stop(a.pid)
	k.checkAcked(topic, acked(a.events()))
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func prefix8(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}
