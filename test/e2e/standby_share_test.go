package e2e

// kcr standby --share-group: a franz-go share consumer (kgoapp -share,
// kgohooks.ShareConsumer) woken by its share group's backlog, on real CRIU
// and the real broker.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// shareStandbyCycles is how many sleep → wake cycles TestStandbyShareCycles
// runs (KCR_SHARE_CYCLES overrides it).
const shareStandbyCycles = 30

// A share consumer under kcr standby --share-group sleeps once its share
// group's backlog is empty and it is idle, and each burst of records wakes
// it (source kafka, from a restore prepared ahead), cycle after cycle: one
// cold start, one restore per cycle, no group hold. Every record is
// processed once; an independent reader finds none missing.
func TestStandbyShareCycles(t *testing.T) {
	k := needKafka(t)
	cycles := shareStandbyCycles
	if s := os.Getenv("KCR_SHARE_CYCLES"); s != "" {
		cycles, _ = strconv.Atoi(s)
	}
	topic, group := k.newTopic("sbshare", 2), uniqueName("sbshare")
	k.shareEarliest(group)
	dir := filepath.Join(t.TempDir(), "img")
	s := k.startStandby(dir, []string{"--idle", "1s", "--share-group", group, "--topics", topic},
		kgoBin, "-brokers", k.brokers, "-topic", topic, "-group", group, "-share", "-client-id", "sbshare")
	start := time.Now()
	for cycle := 1; cycle <= cycles; cycle++ {
		st := s.waitState("standby", 60*time.Second)
		if _, err := os.Stat(filepath.Join(dir, st.Image, "manifest.json")); err != nil {
			t.Fatalf("cycle %d: image %q: %v", cycle, st.Image, err)
		}
		k.produceN(topic, 5)
		s.waitAllProcessed(topic, 60*time.Second)
		s.checkWakePhases(cycle)
		if t.Failed() {
			t.FailNow()
		}
	}
	s.waitState("standby", 60*time.Second)
	t.Logf("%d cycles in %v (not an assertion)", cycles, time.Since(start).Round(time.Second))
	if n := s.countLogs("standby: starting"); n != 1 {
		t.Errorf("%d cold starts, want 1", n)
	}
	if n := s.countLogs("standby: running", "source", "kafka"); n != cycles {
		t.Errorf("%d restores woken by the share backlog, want %d", n, cycles)
	}
	if n := s.countLogs("standby: kafka wake: the share group does not start at the earliest offset"); n != 0 {
		t.Errorf("kcr standby did not see the group's share.auto.offset.reset=earliest (%d warnings)", n)
	}
	if n := s.countLogs("standby: kafka work", "share_group", group); n != cycles {
		t.Errorf("%d share-backlog wakes logged, want %d", n, cycles)
	}
	// The independent reader: every record on the topic was processed.
	got := processed(s.svcEvents())
	recs := k.readTopic(topic)
	missing := 0
	for _, r := range recs {
		if got[po{r.partition, r.offset}] == 0 {
			missing++
		}
	}
	if missing > 0 || len(recs) != 5*cycles {
		t.Errorf("independent reader: %d records, %d never processed; want %d, 0 missing", len(recs), missing, 5*cycles)
	}
	for _, e := range s.svcEvents() {
		if e["ev"] == "after" && e["kind"] != "restore" {
			t.Errorf("after-restore event of kind %v, want restore: %v", e["kind"], e)
		}
	}
}

// A share group left at Kafka's default share.auto.offset.reset=latest:
// kcr standby warns, and records that land while the service sleeps in a
// partition where the group has acknowledged nothing wake it, but do not
// keep it awake (the broker may skip them): it sleeps again.
func TestStandbyShareLatest(t *testing.T) {
	k := needKafka(t)
	topic, group := k.newTopic("sbsharel", 2), uniqueName("sbsharel")
	dir := filepath.Join(t.TempDir(), "img")
	s := k.startStandby(dir, []string{"--idle", "1s", "--share-group", group, "--topics", topic},
		kgoBin, "-brokers", k.brokers, "-topic", topic, "-group", group, "-share", "-client-id", "sbsharel")
	s.waitState("standby", 60*time.Second)
	if n := s.countLogs("standby: kafka wake: the share group does not start at the earliest offset"); n != 1 {
		t.Errorf("%d warnings about share.auto.offset.reset, want 1", n)
	}
	k.produceN(topic, 5)
	eventually(t, 60*time.Second, "a wake by the share backlog", func() (bool, string) {
		n := s.countLogs("standby: running", "source", "kafka")
		return n == 1, fmt.Sprintf("%d wakes", n)
	})
	eventually(t, 60*time.Second, "the woken service checkpointed again", func() (bool, string) {
		n := s.countLogs("standby: checkpointed")
		return n == 2, fmt.Sprintf("%d checkpoints", n)
	})
	s.waitState("standby", 60*time.Second)
}
