package e2e

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// An order produced at a random moment of a sleep (the service being
// checkpointed) is answered without waiting for the dump: kcr standby
// abandons the checkpoint, CRIU resumes the service (its hooks told it
// resumed, not restored), and the same copy processes the order. franz-go
// holding 512 MiB, so that its dump takes a while; every record processed
// exactly once, and no image but complete ones.
func TestStandbyWakeAbandonsCheckpoint(t *testing.T) {
	k := needKafka(t)
	topic, group := k.newTopic("standby-abandon", 2), uniqueName("standby-abandon")
	k.produceN(topic, 4) // commits make the group's topics known
	dir := filepath.Join(t.TempDir(), "img")
	s := k.startStandby(dir, []string{"--idle", "1s", "--group", group, "--poll", "50ms"},
		append(consumerArgs(kgoBin, k.brokers, topic, group), "-ballast-mb", "512")...)
	s.waitAllProcessed(topic, 120*time.Second)

	const tries = 5
	var lat []time.Duration
	for i := range tries {
		s.waitState("checkpointing", 120*time.Second)
		// Anywhere in the checkpoint (the hooks, CRIU's dump, the
		// pages' sync) or just after it.
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
		t0 := time.Now()
		k.produceN(topic, 1)
		s.waitAllProcessed(topic, 120*time.Second)
		lat = append(lat, time.Since(t0))
		t.Logf("try %d: produced → processed %v", i+1, lat[i].Round(time.Millisecond))
	}
	// kcr standby logs the abandon once the service's resume hooks are
	// done: the service may have processed the order first.
	var abandoned, resumes int
	eventually(t, 30*time.Second, "a resume event in the service for each abandoned checkpoint", func() (bool, string) {
		abandoned = s.countLogs("standby: checkpoint abandoned for a wake; the service resumed")
		resumes = 0
		for _, e := range s.svcEvents() {
			if e["ev"] == "after" && e["kind"] == "resume" {
				resumes++
				if e["reason"] != "checkpoint cancelled" {
					t.Fatalf("resumed with reason %v, want \"checkpoint cancelled\"", e["reason"])
				}
			}
		}
		return resumes == abandoned, fmt.Sprintf("%d resume events, %d abandoned checkpoints", resumes, abandoned)
	})
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("%d of %d orders came during a checkpoint that was abandoned; produced → processed median %v", abandoned, tries, lat[tries/2].Round(time.Millisecond))
	if abandoned == 0 {
		t.Errorf("no checkpoint abandoned in %d orders produced during checkpoints", tries)
	}
	if n := s.countLogs("standby: starting"); n != 1 {
		t.Errorf("%d cold starts, want 1", n)
	}
	s.waitState("standby", 120*time.Second)
	imgs, _ := filepath.Glob(filepath.Join(dir, "img-*"))
	if len(imgs) != 1 {
		t.Errorf("images %v, want only the newest", imgs)
	}
	hidden, _ := filepath.Glob(filepath.Join(dir, ".img-*"))
	if len(hidden) != 0 {
		t.Errorf("unfinished images left: %v", hidden)
	}
}
