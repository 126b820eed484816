package e2e

// kcr standby's shutdown: SIGTERM to kcr standby run as init of its own PID
// namespace, the way a container runs it (its exit ends every process in
// the namespace, the service's included).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// startStandbyInit is startStandby with kcr standby as PID 1 of a new PID
// namespace (with its own /proc), as a container's entrypoint.
func (k *kafkaEnv) startStandbyInit(dir string, flags []string, svc ...string) *sbRun {
	k.t.Helper()
	closeInheritedFDs(k.t)
	return k.launchStandby(true, dir, append([]string{"--brokers", k.brokers}, flags...), svc...)
}

// kcrPID is the host PID of kcr standby: unshare's child when it runs as
// init of its own namespace.
func (s *sbRun) kcrPID() int {
	if !s.init {
		return s.cmd.Process.Pid
	}
	var pid int
	eventually(s.t, 30*time.Second, "kcr standby under unshare", func() (bool, string) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", s.cmd.Process.Pid, s.cmd.Process.Pid))
		f := strings.Fields(string(b))
		if err != nil || len(f) == 0 {
			return false, fmt.Sprint(err)
		}
		pid, _ = strconv.Atoi(f[0])
		return pid > 0, ""
	})
	return pid
}

// term sends kcr standby SIGTERM and returns how long it took to exit and
// its exit status.
func (s *sbRun) term(timeout time.Duration) (time.Duration, error) {
	s.t.Helper()
	pid := s.kcrPID()
	t0 := time.Now()
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
		return time.Since(t0), err
	case <-time.After(timeout):
		s.t.Fatalf("kcr standby did not exit within %v of SIGTERM", timeout)
	}
	return 0, nil
}

// Under SIGTERM with the default policy, kcr standby as a container's init
// checkpoints the running consumer and exits 0; records produced while
// nothing runs are then processed by the copy the next kcr standby restores
// from that image (no cold start), each once, and the group's commits (read
// by kcr's own admin client) reach the end of the topic: 0 missing. With
// kafka-go and franz-go.
func TestStandbyTermCheckpoint(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			topic, group := k.newTopic("standby-term", 2), uniqueName("standby-term")
			flags := []string{"--idle", "1h", "--group", group, "--topics", topic}
			svc := consumerArgs(c.bin, k.brokers, topic, group)
			dir := filepath.Join(t.TempDir(), "img")
			s := k.startStandbyInit(dir, flags, svc...)
			s.waitState("running", 60*time.Second)
			k.produceN(topic, 5)
			s.waitAllProcessed(topic, 60*time.Second)
			d, err := s.term(60 * time.Second)
			if err != nil {
				t.Fatalf("kcr standby exited with %v after SIGTERM, want 0", err)
			}
			t.Logf("SIGTERM → service checkpointed and kcr standby exited: %v", d.Round(time.Millisecond))
			if n := s.countLogs("standby: shutdown: the service is checkpointed; the next start restores it"); n != 1 {
				t.Fatalf("%d checkpoints at shutdown logged, want 1", n)
			}
			abs, _ := filepath.Abs(dir)
			if ms := procfs.NamespaceInitsWith("KCR_STANDBY_DIR=" + abs); len(ms) != 0 {
				t.Fatalf("copies of the service run after kcr standby exited: %v", ms)
			}
			// Records wait while nothing runs: the next start restores.
			k.produceN(topic, 5)
			t0 := time.Now()
			s2 := k.startStandbyInit(dir, flags, svc...)
			s2.waitAllProcessed(topic, 60*time.Second)
			if first, ok := s2.firstProcessed(t0); ok {
				t.Logf("next start → first record processed: %v", first.Sub(t0).Round(time.Millisecond))
			}
			if n := s2.countLogs("standby: starting"); n != 0 {
				t.Errorf("%d cold starts after the shutdown's checkpoint, want 0", n)
			}
			if n := s2.countLogs("standby: running", "source", "kafka"); n != 1 {
				t.Errorf("%d restores woken by the waiting records, want 1", n)
			}
			k.waitCommitted(group, topic, k.endOffsets(topic), 60*time.Second)
			if _, err := s2.term(60 * time.Second); err != nil {
				t.Errorf("the second kcr standby exited with %v after SIGTERM, want 0", err)
			}
		})
	}
}

// closeInheritedFDs marks the descriptors this test process inherited
// (from the shell that ran go test) close-on-exec: inherited, they would
// reach the service through kcr, on mounts of the host's mount namespace
// that CRIU cannot find in the service's.
func closeInheritedFDs(t *testing.T) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
