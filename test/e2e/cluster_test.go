package e2e

// kcr on a production-shaped cluster: three brokers, SASL_SSL, replication
// factor 3 (scripts/kafka-up.sh with KCR_KAFKA_BROKERS_N=3).

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A service started with kcr run produces numbered records over SASL_SSL:
// checkpoint → restore, then checkpoint --leave-running → restore --count 3
// beside the original. kafka-go over SCRAM-SHA-512 (and its group Reader),
// franz-go over OAUTHBEARER with 5 s tokens: each image waits 6 s, so every
// token in it has expired, and the restored clients must mint new ones (0
// SASL failures). An independent reader then finds every acknowledged
// record on the topic, and none twice but those the leave-running image
// held (each clone sends them once).
func TestClusterCheckpointRestore(t *testing.T) {
	for _, tc := range []struct {
		name, bin, mech string
		extra           []string
	}{
		{"kafka-go-scram", kafkaBin, "scram-sha-512", []string{"-consume"}},
		{"franz-go-oauthbearer", kgoBin, "oauthbearer", []string{"-kgo-log", "-token-lifetime", "5s", "-listen", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) { testClusterCheckpointRestore(t, tc.bin, tc.mech, tc.extra) })
	}
}

func testClusterCheckpointRestore(t *testing.T, bin, mech string, extra []string) {
	c := needCluster(t)
	start := time.Now()
	topic := c.newTopic("cluster-cr", 3)
	args := append(c.clientArgs(mech), "-topic", topic, "-produce-rate", "100", "-client-id", "cl")
	if slices.Contains(extra, "-consume") {
		args = append(args, "-group", uniqueName("cluster-cr"))
	}
	pid, a := c.runBin(bin, append(args, extra...)...)
	a.waitAcked(100, 60*time.Second)
	const wait = 6 * time.Second // longer than the 5 s tokens

	// checkpoint → restore
	img := checkpointGone(t, pid)
	time.Sleep(wait)
	n1 := len(a.events())
	rpid, out := restore(t, img)
	tr := time.Now()
	if ev := a.waitAfter(n1, 30*time.Second); ev.str("kind") != "restore" || ev.str("instance") != out["instance_id"] {
		t.Fatalf("after-restore event %v: want kind restore, instance %v", ev, out["instance_id"])
	}
	a.waitSince(n1, 100, slices.Contains(extra, "-consume"))
	t.Logf("restored PID %d acknowledged 100 records %v after kcr restore returned", rpid, time.Since(tr).Round(time.Millisecond))

	// checkpoint --leave-running → restore --count 3 beside the original
	n2 := len(a.events())
	img2 := filepath.Join(t.TempDir(), "img2")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", img2, strconv.Itoa(rpid))
	held, _ := a.pendingAt(n2)
	time.Sleep(wait)
	n3 := len(a.events())
	clones := restoreClones(t, img2, "cl", 3)
	eventually(t, 60*time.Second, "the original and its 3 clones producing", func() (bool, string) {
		evs := a.since(n3)
		ok, s := true, []string{}
		for _, p := range append([]int{rpid}, pidsOf(clones)...) {
			n := len(acked(of(evs, p)))
			ok = ok && n >= 50
			s = append(s, fmt.Sprintf("%d: %d", p, n))
		}
		return ok, strings.Join(s, ", ")
	})
	stopAll(t, a, append(clones, kclone{PID: rpid, Name: "original"}))

	c.checkClusterTopic(a, topic, rpid, held)
	if mech == "oauthbearer" {
		checkTokens(t, a, n1, n3, clones)
	}
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}

func pidsOf(cs []kclone) []int {
	var ps []int
	for _, c := range cs {
		ps = append(ps, c.PID)
	}
	return ps
}

// waitSince waits until n records were acknowledged (and, with consume, 10
// processed) after the first skip events.
func (a *kapp) waitSince(skip, n int, consume bool) {
	a.t.Helper()
	eventually(a.t, 60*time.Second, fmt.Sprintf("%d records acknowledged", n), func() (bool, string) {
		evs := a.since(skip)
		ac, pr := len(acked(evs)), len(processed(evs))
		return ac >= n && (!consume || pr >= 10), fmt.Sprintf("%d acknowledged, %d processed; last events %v", ac, pr, tail(evs, 3))
	})
}

// checkClusterTopic reads topic with the test's own client: every record a
// process saw acknowledged is there (by writer host PID and number), and
// none is there twice but those that PID leaver held at its leave-running
// checkpoint (held), which each clone sends again, and those whose write
// failed and was retried (kafka-go's Writer is not idempotent: a write that
// timed out may have been written).
func (c *clusterEnv) checkClusterTopic(a *kapp, topic string, leaver int, held []int) {
	t := c.t
	t.Helper()
	type rec struct{ hpid, n int }
	ack := map[rec]bool{}
	for _, e := range a.events() {
		if e["ev"] == "acked" {
			for n := int(num(e["from"])); n <= int(num(e["to"])); n++ {
				ack[rec{int(num(e["rhpid"])), n}] = true
			}
		}
	}
	retried := map[int]bool{}
	for _, e := range a.events() {
		if e["ev"] == "write-error" {
			for n := range runNumbers(e) {
				retried[n] = true
			}
		}
	}
	on := map[rec]int{}
	recs := c.readTopic(topic)
	for _, r := range recs {
		on[rec{r.hpid, r.n}]++
	}
	var missing, dups []string
	for r := range ack {
		if on[r] == 0 {
			missing = append(missing, fmt.Sprintf("%d/%d", r.hpid, r.n))
		}
	}
	heldDups, retriedDups := 0, 0
	for r, n := range on {
		switch {
		case n > 1 && r.hpid == leaver && slices.Contains(held, r.n):
			heldDups += n - 1
		case n > 1 && retried[r.n]:
			retriedDups += n - 1
		case n > 1:
			dups = append(dups, fmt.Sprintf("%d/%d ×%d", r.hpid, r.n, n))
		}
	}
	t.Logf("topic %s: %d records, %d acknowledged to the processes; %d copies of the %d records held at the leave-running checkpoint, %d of records whose write was retried",
		topic, len(recs), len(ack), heldDups, len(held), retriedDups)
	if len(ack) == 0 {
		t.Errorf("no record acknowledged")
	}
	if len(missing) > 0 {
		t.Errorf("%d acknowledged records missing from the topic: %v", len(missing), missing[:min(len(missing), 20)])
	}
	if len(dups) > 0 {
		t.Errorf("%d records on the topic more than once: %v", len(dups), dups[:min(len(dups), 20)])
	}
}

// checkTokens asserts that the restored process minted a fresh token
// (events after skip1), and each clone too (after skip2), and that kgo
// logged no SASL failure.
func checkTokens(t *testing.T, a *kapp, skip1, skip2 int, clones []kclone) {
	t.Helper()
	if count(a.since(skip1), "token") == 0 {
		t.Errorf("no token minted after the restore")
	}
	for _, c := range clones {
		if count(of(a.since(skip2), c.PID), "token") == 0 {
			t.Errorf("clone %d minted no token after its restore", c.PID)
		}
	}
	for _, e := range a.events() {
		if e["ev"] == "log" && strings.Contains(strings.ToLower(fmt.Sprint(e)), "sasl") {
			t.Errorf("kgo logged a SASL failure: %v", e)
		}
		if e["ev"] == "log" && strings.Contains(fmt.Sprint(e), "option inspection") {
			t.Errorf("kgohooks' option probe reached the app's logger: %v", e)
		}
	}
}
