package e2e

// Kafka end-to-end tests of docs/kafka-go-options.md's rules, on the real
// broker and real CRIU; what is on the broker is checked with the test's own franz-go client.

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// derivedBase is what kafkaapp -reproduce adds to a record's number.
const derivedBase = 1000000

// A Completion that writes: an async Writer whose Completion writes to the same
// Writer (the retry or dead-letter pattern) is checkpointed under load. The
// checkpoint does not wedge, the Writer acknowledges again within 10 s of
// the restore, and every record acknowledged, and every record the
// Completions wrote, is on the topic.
func TestKafkaCompletionReproduces(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("reproduce", 3)
	a := k.start("-topic", topic, "-produce-rate", "200", "-async", "-reproduce", "5", "-client-id", "repro")
	a.waitAcked(300, 30*time.Second)
	eventually(t, 10*time.Second, "records written by Completions acknowledged", func() (bool, string) {
		for n := range acked(a.events()) {
			if n >= derivedBase {
				return true, ""
			}
		}
		return false, "none yet"
	})

	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--hook-budget", "10s", "-o", img, strconv.Itoa(a.pid))
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpointed process is still running")
	}
	t.Logf("writer report in the manifest: %v", manifestResource(t, img, "kafka-writer/"+topic))
	before := len(acked(a.events()))

	n1 := len(a.events())
	pid, _ := restore(t, img)
	tr := time.Now()
	a.waitAfter(n1, 30*time.Second)
	d := eventually(t, 10*time.Second, "the Writer acknowledging records again after the restore, Completion writes included", func() (bool, string) {
		base, derived := 0, 0
		for n := range acked(a.since(n1)) {
			if n >= derivedBase {
				derived++
			} else {
				base++
			}
		}
		return base >= 100 && derived >= 10, fmt.Sprintf("%d records and %d Completion writes acknowledged since the restore", base, derived)
	})
	t.Logf("%d records acknowledged before the checkpoint; after the restore 100 more and 10 Completion writes within %v of kcr restore (%v of waiting)",
		before, time.Since(tr).Round(time.Millisecond), d.Round(time.Millisecond))
	if n := count(a.events(), "reproduce-error"); n > 0 {
		t.Errorf("%d Completion writes failed before the app was stopped", n)
	}
	nStop := len(a.events())
	a.stop(pid)

	all := acked(a.events())
	on := k.checkAcked(topic, all)
	// A Completion that runs while the app closes its Writer may be told
	// its write failed; every other derived record must be on the topic.
	told := recordsOf(a.since(nStop), "reproduce-error")
	var missing []int
	derived := 0
	for n := range all {
		if n >= derivedBase || n%5 != 0 {
			continue
		}
		derived++
		if on[n+derivedBase] == 0 && !told[n+derivedBase] {
			missing = append(missing, n+derivedBase)
		}
	}
	t.Logf("%d acknowledged records called for a Completion write; %d writes failed at the app's shutdown", derived, len(told))
	if len(missing) > 0 {
		t.Errorf("%d records written by Completions are missing from the topic and no one was told: %s", len(missing), runsOf(missing, 20))
	}
}

// Tailing readers. A partition Reader after
// SetOffset(LastOffset), and a new group at StartOffset LastOffset, read a
// topic the test produces to before, during and after a checkpoint→restore.
// Every offset from the one the Reader resolved its start to (the first it
// delivered) up to the end is delivered. The group app never commits, so
// its partition has no commit when it leaves the group at the checkpoint:
// the Reader must commit its start there (kadm) or the rejoin jumps to the
// new end. In partition-idle nothing is produced from the Reader's start
// to the checkpoint: it must start after the restore at the end it saw
// before, not at the new one.
func TestKafkaTailingReaders(t *testing.T) {
	for _, c := range []struct {
		name, group string
		idle        bool
	}{{"partition", "", false}, {"partition-idle", "", true}, {"group", uniqueName("tail"), false}} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			topic := k.newTopic("tail-"+c.name, 1)
			prod := k.produce(topic, 50)
			time.Sleep(time.Second) // records before the Reader starts, which it must not read
			if c.idle {
				prod.finish()
			}
			e0 := k.endOffsets(topic)[0]
			args := []string{"-topic", topic, "-consume", "-start-last", "-client-id", "tail"}
			if c.group != "" {
				args = append(args, "-group", c.group, "-no-commit")
			} else {
				args = append(args, "-partition", "0")
			}
			a := k.start(args...)
			if c.idle {
				time.Sleep(2 * time.Second) // the Reader polls the idle end
			} else {
				a.waitProcessed(0, 50, 30*time.Second)
			}

			img := filepath.Join(t.TempDir(), "img")
			runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
			<-a.done
			res := "kafka-reader/" + topic + "/0"
			if c.group != "" {
				res = "kafka-reader/" + c.group
			}
			t.Logf("reader report in the manifest: %v", manifestResource(t, img, res))
			var startCommit int64 = -1
			if c.group != "" {
				cm, err := k.committed(c.group, topic)
				if err != nil {
					t.Fatalf("committed offsets of %s: %v", c.group, err)
				}
				var ok bool
				if startCommit, ok = cm[0]; !ok {
					t.Fatalf("no committed offset of %s after the checkpoint (%v): the rejoin would start at the new end", c.group, cm)
				}
			}
			if c.idle {
				prod = k.produce(topic, 50)
			}
			time.Sleep(time.Second) // records produced while the image sits on disk
			n1 := len(a.events())
			pid, _ := restore(t, img)
			a.waitAfter(n1, 30*time.Second)
			a.waitProcessed(n1, 50, 30*time.Second)

			prod.finish()
			produced, perrs := prod.snapshot()
			end := k.endOffsets(topic)[0]
			var first int64 = -1
			eventually(t, 30*time.Second, fmt.Sprintf("every offset up to %d delivered", end), func() (bool, string) {
				got := processed(a.events())
				first = -1
				for x := range got {
					if first < 0 || x.o < first {
						first = x.o
					}
				}
				var miss []int
				for o := first; o < end; o++ {
					if got[po{0, o}] == 0 {
						miss = append(miss, int(o))
					}
				}
				return first >= 0 && len(miss) == 0, fmt.Sprintf("from %d: %d missing %s", first, len(miss), runsOf(miss, 10))
			})
			t.Logf("end before the Reader started %d, first delivered %d, end %d; %d records produced (%d errors)", e0, first, end, len(produced), perrs)
			if c.group != "" && startCommit != first {
				t.Errorf("the group committed %d at the checkpoint; want the first offset the Reader handed out, %d", startCommit, first)
			}
			if c.idle && first != e0 {
				t.Errorf("the idle Reader at LastOffset delivered first offset %d; want %d, the end when it started", first, e0)
			}
			if first < e0 {
				t.Errorf("the Reader at LastOffset delivered offset %d, before the end %d when it started", first, e0)
			}
			a.stop(pid)
		})
	}
}

// Batched commits across a broker restart: a group Reader with CommitInterval 1s is checkpointed
// while the broker restarts, so its hook starts with batched commits that
// cannot reach the broker (gone, then its coordinator loading) and retries
// them until they land. The committed offset (kadm) covers everything
// processed before the checkpoint, and nothing processed then is delivered
// again after the restore.
func TestKafkaCommitIntervalFailingCommit(t *testing.T) {
	k := needKafka(t)
	k.restartsBroker()
	topic, group, prod := k.groupTopic("interval", 1, 100)
	a := k.start("-topic", topic, "-group", group, "-consume", "-commit-interval", "1s", "-client-id", "interval", "-log-level", "debug")
	a.waitProcessed(0, 200, 30*time.Second)

	// The broker goes away with commits in the Reader's batch: the producer
	// keeps going until then, so records processed after the Reader's last
	// interval commit are always pending. The checkpoint starts while the
	// broker is down and ends once it is back.
	script(t, "kafka-down.sh")
	n0 := len(a.events())
	img := filepath.Join(t.TempDir(), "img")
	ck := make(chan kcrResult, 1)
	go func() {
		ck <- runKCR(t, kcrOpts{}, "checkpoint", "--hook-budget", "90s", "-o", img, strconv.Itoa(a.pid))
	}()
	// The hook must start while the broker is down with commits in the
	// batch. Whether its first flush errors at once or blocks until the
	// broker is back depends on how far kafka-go's generation has torn down,
	// so the test waits for the hook itself, not for a failed flush.
	var pending float64 = -1
	eventually(t, 60*time.Second, "the reader's before-checkpoint hook", func() (bool, string) {
		for _, e := range a.since(n0) {
			if e["ev"] == "log" && e.str("msg") == "kafka reader quiescing" {
				pending, _ = e["pending_commit_partitions"].(float64)
				return true, ""
			}
		}
		return false, fmt.Sprintf("last events %v", tail(a.events(), 3))
	})
	if pending < 1 {
		t.Fatalf("the hook began with %v partitions of commits pending; the test needs some pending while the broker is down", pending)
	}
	script(t, "kafka-up.sh", "KCR_KAFKA_KEEP_DATA=1")
	prod.finish() // its buffered records are delivered once the broker is back
	var r kcrResult
	select {
	case r = <-ck:
	case <-time.After(100 * time.Second):
		t.Fatal("kcr checkpoint did not return")
	}
	if r.code != 0 {
		r.log(t, []string{"checkpoint"})
		t.Fatalf("kcr checkpoint: exit %d", r.code)
	}
	<-a.done
	var fails []string
	for _, e := range a.since(n0) {
		if e["ev"] == "log" && e.str("msg") == "flushing commits before a checkpoint" {
			fails = append(fails, e.str("err"))
		}
	}
	t.Logf("%d commit flushes failed during the hooks %q; reader report %v",
		len(fails), fails, manifestResource(t, img, "kafka-reader/"+group))

	before := processed(a.events())
	var last int64 = -1
	for x := range before {
		last = max(last, x.o)
	}
	var cm map[int32]int64
	eventually(t, 30*time.Second, "the committed offsets of "+group, func() (bool, string) {
		var err error
		cm, err = k.committed(group, topic) // the admin client reconnects after the restart
		return err == nil, fmt.Sprint(err)
	})
	if cm[0] != last+1 {
		t.Fatalf("committed offset after the checkpoint %v; want %d, past the last record processed (%d)", cm, last+1, last)
	}

	n1 := len(a.events())
	pid, _ := restore(t, img)
	a.waitAfter(n1, 60*time.Second)
	prod2 := k.produce(topic, 100)
	a.waitProcessed(n1, 100, 60*time.Second)
	prod2.finish()
	end := k.endOffsets(topic)[0]
	k.waitCommitted(group, topic, map[int32]int64{0: end}, 60*time.Second)
	var again []int
	for x := range processed(a.since(n1)) {
		if before[x] > 0 {
			again = append(again, int(x.o))
		}
	}
	t.Logf("processed before the checkpoint: offsets 0..%d; after the restore %d records, up to the end %d", last, len(processed(a.since(n1))), end)
	if len(again) > 0 {
		t.Errorf("%d records committed before the checkpoint were delivered again: %s", len(again), runsOf(again, 10))
	}
	a.stop(pid)
}

// Interrupted requests: a sync Writer with MaxAttempts 1 is checkpointed while
// the broker is frozen (SIGSTOP) past the hook budget, so requests on the
// wire are interrupted. kafkaapp does not write failed records again. What
// the callers were told is compared with what is on the topic: every
// record acknowledged is there, every record handed to the Writer got an
// answer, and a record told failed may still be on the topic (the known
// gap, counted as requests_interrupted).
func TestKafkaMaxAttemptsOneBrokerStopped(t *testing.T) {
	k := needKafka(t)
	k.brokerPID()
	topic := k.newTopic("attempts", 3)
	a := k.start("-topic", topic, "-produce-rate", "200", "-max-attempts", "1", "-no-retry", "-client-id", "once")
	a.waitAcked(300, 30*time.Second)

	img := filepath.Join(t.TempDir(), "img")
	k.checkpointBrokerStopped(a, img)
	<-a.done
	t.Logf("writer report in the manifest: %v", manifestResource(t, img, "kafka-writer/"+topic))

	n1 := len(a.events())
	pid, out := restore(t, img)
	a.waitAfter(n1, 60*time.Second)
	rep := restoreReport(out, "kafka-writer/"+topic)
	t.Logf("writer after-restore report: %v", rep)
	a.waitAcked(len(acked(a.events()))+200, 60*time.Second)
	a.stop(pid)

	evs := a.events()
	ok := acked(evs)
	told := recordsOf(evs, "write-error")
	on := k.checkAcked(topic, ok)
	top := 0
	for n := range ok {
		top = max(top, n)
	}
	for n := range told {
		top = max(top, n)
	}
	var silent, toldOn, toldMissing []int
	for n := 1; n <= top; n++ {
		switch {
		case ok[n] == 0 && !told[n]:
			silent = append(silent, n)
		case told[n] && on[n] > 0:
			toldOn = append(toldOn, n)
		case told[n]:
			toldMissing = append(toldMissing, n)
		}
	}
	t.Logf("records 1..%d: %d acknowledged, %d told failed: %d of them on the topic anyway %s (requests_interrupted %v, records_interrupted %v), %d not on it %s",
		top, len(ok), len(told), len(toldOn), runsOf(toldOn, 10), rep["requests_interrupted"], rep["records_interrupted"], len(toldMissing), runsOf(toldMissing, 10))
	if len(silent) > 0 {
		t.Errorf("%d records handed to the Writer were neither acknowledged nor failed: %s", len(silent), runsOf(silent, 20))
	}
	if len(toldOn) > 0 && num(rep["requests_interrupted"]) == 0 {
		t.Errorf("%d records told failed are on the topic, but the Writer reports no interrupted request", len(toldOn))
	}
	// The records, not only the requests, are counted: exactly the
	// records whose write failed with the interruption (kafkaapp logs a
	// call's failed records apart, per kafka.WriteErrors).
	interrupted := 0
	for _, e := range evs {
		if e["ev"] == "write-error" && strings.Contains(e.str("err"), "interrupted by a checkpoint") {
			interrupted += len(runNumbers(e))
		}
	}
	if _, ok := rep["records_interrupted"]; !ok || int(num(rep["records_interrupted"])) != interrupted {
		t.Errorf("records_interrupted %v, but %d records were told failed by the interruption", rep["records_interrupted"], interrupted)
	}
}
