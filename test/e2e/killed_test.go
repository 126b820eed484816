package e2e

// kcr SIGKILLed in the middle of a checkpoint (issue 7): the Kafka service
// resumes within a moment of kcr's death, not after --resume-after, and the
// broker, read with the test's own client, is missing no record the app saw
// acknowledged.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestKCRKilledDuringCheckpoint(t *testing.T) {
	for _, c := range []struct {
		name string
		// env and args for kcr checkpoint; kill is when to SIGKILL it,
		// after the app's last before-checkpoint hook ran.
		env  func(t *testing.T) []string
		kill time.Duration
	}{
		// After the hooks, before CRIU is asked to dump.
		{"after-hooks", func(*testing.T) []string { return []string{"KCR_TEST_STALL_AFTER_HOOKS=60s"} }, 300 * time.Millisecond},
		// CRIU slow to start: kcr dies while the dump request waits for it.
		{"slow-criu", func(t *testing.T) []string { return []string{"KCR_CRIU=" + slowCRIU(t, 3*time.Second)} }, 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			topic := k.newTopic("killed", 3)
			a := k.start("-topic", topic, "-produce-rate", "200", "-client-id", "killed")
			a.waitAcked(200, 30*time.Second)
			n0 := len(a.events())
			cmd := exec.Command(kcrBin, "checkpoint", "-o", filepath.Join(t.TempDir(), "img"), strconv.Itoa(a.pid))
			cmd.Env = append(os.Environ(), c.env(t)...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "the before-checkpoint hooks", func() (bool, string) {
				return count(a.since(n0), "pending") > 0, "no pending event yet"
			})
			time.Sleep(c.kill)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			killed := time.Now()
			ev := a.waitAfter(n0, 10*time.Second)
			resumed := time.Since(killed)
			if ev.str("kind") != "resume" {
				t.Fatalf("after kcr died: %v, want a resume", ev)
			}
			// The app's hooks resumed; now it must be producing again.
			base := len(acked(a.events()))
			eventually(t, 10*time.Second, "records acknowledged after the resume", func() (bool, string) {
				return len(acked(a.events())) > base+10, fmt.Sprintf("%d acknowledged", len(acked(a.events())))
			})
			producing := time.Since(killed)
			t.Logf("kcr killed: hooks resumed after %v, producing again after %v (reason %q)",
				resumed.Round(time.Millisecond), producing.Round(time.Millisecond), ev.str("reason"))
			if producing > 3*time.Second {
				t.Errorf("the app produced again %v after kcr died; want ≤ 3s (goal 1s)", producing)
			}
			if !alive(a.pid) {
				t.Fatal("the app died")
			}
			a.stop(a.pid)
			k.checkAcked(topic, acked(a.events()))
		})
	}
}

// slowCRIU returns a CRIU wrapper that sleeps d before "criu swrk" starts.
func slowCRIU(t *testing.T, d time.Duration) string {
	t.Helper()
	real, err := exec.LookPath("criu")
	if err != nil {
		t.Fatalf("criu: %v", err)
	}
	p := filepath.Join(binDir, "slow-criu-"+strconv.Itoa(int(d.Milliseconds())))
	script := fmt.Sprintf("#!/bin/sh\n[ \"$1\" = swrk ] && sleep %.3f\nexec %s \"$@\"\n", d.Seconds(), real)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
