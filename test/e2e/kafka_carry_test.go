package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify/client"
)

// Carried records under RequireDrained, on real CRIU and Kafka: an async Writer (kafkaapp under
// kcr run) holds accepted records that a frozen broker (SIGSTOP) does not
// acknowledge within the budget.
//   - kcr checkpoint --require-drained fails with exit 10 naming the Writer
//     and the count, writes no image, and the app keeps producing: every
//     record it was told acknowledged is on the topic, none failed.
//   - Without the flag the image is written and carries them: the manifest
//     and kcr inspect show the count, and kcr restore --count 2 is refused
//     (exit 10, naming --allow-duplicates); a single restore delivers them.
func TestKafkaRequireDrained(t *testing.T) {
	k := needKafka(t)
	k.brokerPID()
	topic := k.newTopic("drained", 3)
	pid, a := k.run("-topic", topic, "-produce-rate", "200", "-async", "-client-id", "drained")
	a.waitAcked(300, 30*time.Second)
	writer := "kafka-writer/" + topic

	// 1. --require-drained with records that cannot drain: refused.
	img1 := filepath.Join(t.TempDir(), "img1")
	var r kcrResult
	k.whileBrokerStopped(a, func() {
		r = runKCR(t, kcrOpts{}, "checkpoint", "--require-drained", "--hook-budget", "1s", "-o", img1, strconv.Itoa(pid))
	})
	if r.code != 10 || !strings.Contains(r.stderr, `"`+writer+`"`) || !strings.Contains(r.stderr, "would carry") || !strings.Contains(r.stderr, "--require-drained") {
		r.log(t, nil)
		t.Fatalf("kcr checkpoint --require-drained: exit %d, want 10 naming %s and the records it would carry", r.code, writer)
	}
	if _, err := os.Stat(img1); !os.IsNotExist(err) {
		t.Errorf("refused checkpoint left %s: %v", img1, err)
	}
	if !alive(pid) {
		t.Fatal("the app is gone after a refused checkpoint")
	}
	t.Logf("refused: %s", lastLine(r.stderr))
	n0 := len(acked(a.events()))
	a.waitAcked(n0+300, 30*time.Second)
	if s := a.state(); s.Failed > 0 {
		t.Errorf("%d records failed around the refused checkpoint", s.Failed)
	}
	all := acked(a.events())
	top := 0
	for n := range all {
		top = max(top, n)
	}
	// The newest 100 may still be in flight. One partition's acknowledgements
	// can lag the others' by seconds while kafka-go retries on a connection
	// from before the broker's restart (seen in CI), so "never acknowledged"
	// means not within 30 s.
	lag := eventually(t, 30*time.Second, "the records to be acknowledged after the refused checkpoint", func() (bool, string) {
		all = acked(a.events())
		var gap []int
		for n := 1; n <= top-100; n++ {
			if all[n] == 0 {
				gap = append(gap, n)
			}
		}
		return len(gap) == 0, fmt.Sprintf("%d records below %d never acknowledged: %s", len(gap), top-100, runsOf(gap, 10))
	})
	t.Logf("every record below %d acknowledged, %v after the first look", top-100, lag.Round(time.Millisecond))
	k.checkAcked(topic, all)

	// kcr had its answer before the resume after the refusal was over if
	// that took long (the Writer resending to the broker); until it is
	// over, a new checkpoint is refused as busy.
	eventually(t, 30*time.Second, "the app to be idle after its resume", func() (bool, string) {
		sock, err := client.Find(pid)
		if err != nil {
			return false, err.Error()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := sock.Hello(ctx)
		if err != nil {
			return false, err.Error()
		}
		return info.State == "idle", "state " + info.State
	})

	// 2. The same without the flag: the image carries them.
	img2 := filepath.Join(t.TempDir(), "img2")
	k.checkpointBrokerStopped(a, img2)
	eventually(t, 10*time.Second, "the checkpointed process to be gone", func() (bool, string) {
		return !alive(pid), fmt.Sprintf("PID %d still running", pid)
	})
	ins := runKCR(t, kcrOpts{log: logFailed}, "inspect", "--json", img2)
	var m struct {
		Carried   int64 `json:"records_carried"`
		Resources []struct {
			Name    string         `json:"name"`
			Carried int64          `json:"records_carried"`
			Details map[string]any `json:"details"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(ins.stdout), &m); err != nil {
		t.Fatal(err)
	}
	var wc int64 = -1
	for _, res := range m.Resources {
		if res.Name == writer {
			wc = res.Carried
			if num(res.Details["records_carried"]) != float64(wc) {
				t.Errorf("manifest: %s carries %d, its report says %v", writer, wc, res.Details["records_carried"])
			}
		}
	}
	if m.Carried <= 0 || wc != m.Carried {
		t.Fatalf("manifest: records_carried %d, %s %d: want the Writer's carried records, > 0", m.Carried, writer, wc)
	}
	txt := runKCR(t, kcrOpts{log: logFailed}, "inspect", img2)
	if want := fmt.Sprintf("carried       %d records (%s %d)", m.Carried, writer, m.Carried); !strings.Contains(txt.stdout, want) {
		t.Errorf("kcr inspect lacks %q:\n%s", want, txt.stdout)
	}
	r = runKCR(t, kcrOpts{}, "restore", "--count", "2", img2)
	if r.code != 10 || !strings.Contains(r.stderr, "--allow-duplicates") || !strings.Contains(r.stderr, strconv.FormatInt(m.Carried, 10)+" records") {
		r.log(t, nil)
		t.Fatalf("kcr restore --count 2 of an image carrying %d records: exit %d, want 10 naming --allow-duplicates", m.Carried, r.code)
	}
	t.Logf("image carries %d records; restore --count 2 refused: %s", m.Carried, lastLine(r.stderr))

	// A single restore is allowed and delivers them.
	n1 := len(a.events())
	pid2, _ := restore(t, img2)
	t.Cleanup(func() { killWait(pid2) })
	a.waitAfter(n1, 60*time.Second)
	a.waitAcked(len(acked(a.events()))+200, 60*time.Second)
	a.stop(pid2)
	if s := count(a.events(), "write-error"); s > 0 {
		t.Errorf("%d write errors", s)
	}
	k.checkAcked(topic, acked(a.events()))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// The same through runc: kcr checkpoint --container --require-drained
// reaches kcr's CRIU action script ($KCR_HOOK_REQUIRE_DRAINED), which makes
// runc's dump fail with the Writer's veto (exit 10, no image, the container
// keeps producing); a --leave-running image that carries records is
// refused by kcr restore --container without --allow-duplicates.
func TestContainerRequireDrained(t *testing.T) {
	k := needKafka(t)
	k.brokerPID()
	t.Setenv("KCR_HOOK_BUDGET", "1s") // the action script's hook budget
	topic := k.newTopic("kcr-ctr-drained", 1)
	c := newContainer(t, k, nil, "-topic", topic, "-produce-rate", "200", "-async")
	c.waitAcked(100, 30*time.Second)
	writer := "kafka-writer/" + topic
	stopped := func(args ...string) (r kcrResult) {
		k.whileBrokerStopped(c.kapp, func() {
			r = runKCR(t, kcrOpts{}, append([]string{"checkpoint", "--container", c.id, "--runc-root", c.root}, args...)...)
		})
		return r
	}
	dir := t.TempDir()
	r := stopped("--require-drained", "-o", filepath.Join(dir, "img1"))
	if r.code != 10 || !strings.Contains(r.stderr, "would carry") || !strings.Contains(r.stderr, writer) {
		r.log(t, nil)
		t.Fatalf("kcr checkpoint --container --require-drained: exit %d, want 10 naming %s and the records it would carry", r.code, writer)
	}
	t.Logf("refused: %s", lastLine(r.stderr))
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused checkpoint left %v", ents)
	}
	c.mustRun("a refused checkpoint")
	c.waitAcked(len(acked(c.events()))+200, 30*time.Second)

	img := filepath.Join(dir, "img2")
	if r := stopped("--leave-running", "-o", img); r.code != 0 {
		r.log(t, nil)
		t.Fatalf("kcr checkpoint --container --leave-running: exit %d", r.code)
	}
	var m struct {
		Carried int64 `json:"records_carried"`
	}
	if err := json.Unmarshal([]byte(runKCR(t, kcrOpts{log: logFailed}, "inspect", "--json", img).stdout), &m); err != nil || m.Carried <= 0 {
		t.Fatalf("manifest of the container image: records_carried %d (%v), want > 0", m.Carried, err)
	}
	r = runKCR(t, kcrOpts{}, "restore", "--container", c.id+"-copy", "--runc-root", c.root, img)
	if r.code != 10 || !strings.Contains(r.stderr, "--leave-running") || !strings.Contains(r.stderr, "--allow-duplicates") {
		r.log(t, nil)
		t.Fatalf("kcr restore --container of a --leave-running image carrying %d records: exit %d, want 10 naming --allow-duplicates", m.Carried, r.code)
	}
	t.Logf("image carries %d records; restore refused: %s", m.Carried, lastLine(r.stderr))
	c.waitAcked(len(acked(c.events()))+200, 30*time.Second)
	c.stop(c.pid)
	if n := count(c.events(), "write-error"); n > 0 {
		t.Errorf("%d write errors", n)
	}
	k.checkAcked(topic, acked(c.events()))
}
