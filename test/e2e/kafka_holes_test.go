package e2e

// Kafka end-to-end tests of issue 9's holes, on the real broker and real
// CRIU; what is on the broker is checked with the test's own franz-go client.

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// derivedBase is what kafkaapp -reproduce adds to a record's number.
const derivedBase = 1000000

// Issue 9, hole 1: an async Writer whose Completion writes to the same
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
	mustKCR(t, "checkpoint", "--timeout", "10s", "-o", img, strconv.Itoa(a.pid))
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
	told := map[int]bool{}
	for _, e := range a.since(nStop) {
		if e["ev"] != "reproduce-error" {
			continue
		}
		rs, _ := e["records"].([]any)
		for _, r := range rs {
			ft := r.([]any)
			for n := int(ft[0].(float64)); n <= int(ft[1].(float64)); n++ {
				told[n] = true
			}
		}
	}
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

// Issue 9, holes 2 and 3: tailing readers. A partition Reader after
// SetOffset(LastOffset), and a new group at StartOffset LastOffset, read a
// topic the test produces to before, during and after a checkpoint→restore.
// Every offset from the one the Reader resolved its start to (the first it
// delivered) up to the end is delivered. The group app never commits, so
// its partition has no commit when it leaves the group at the checkpoint:
// the Reader must commit its start there (kadm) or the rejoin jumps to the
// new end.
func TestKafkaTailingReaders(t *testing.T) {
	for _, c := range []struct{ name, group string }{{"partition", ""}, {"group", uniqueName("tail")}} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			topic := k.newTopic("tail-"+c.name, 1)
			prod := k.produce(topic, 50)
			time.Sleep(time.Second) // records before the Reader starts, which it must not read
			e0 := k.endOffsets(topic)[0]
			args := []string{"-topic", topic, "-consume", "-start-last", "-client-id", "tail"}
			if c.group != "" {
				args = append(args, "-group", c.group, "-no-commit")
			} else {
				args = append(args, "-partition", "0")
			}
			a := k.start(args...)
			a.waitProcessed(0, 50, 30*time.Second)

			img := filepath.Join(t.TempDir(), "img")
			mustKCR(t, "checkpoint", "-o", img, strconv.Itoa(a.pid))
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
			if first < e0 {
				t.Errorf("the Reader at LastOffset delivered offset %d, before the end %d when it started", first, e0)
			}
			a.stop(pid)
		})
	}
}
