package e2e

// kcr standby's shutdown: SIGTERM to kcr standby run as init of its own PID
// namespace, the way a container runs it (its exit ends every process in
// the namespace, the service's included).

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// startStandbyInit is startStandby with kcr standby as PID 1 of a new PID
// namespace (with its own /proc), as a container's entrypoint.
func (k *kafkaEnv) startStandbyInit(dir string, flags []string, svc ...string) *sbRun {
	k.t.Helper()
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
// by kcr's own admin client) reach the end of the topic: 0 missing. Then
// the same with --on-term stop: a graceful stop and a cold start, nothing
// missing. With kafka-go and franz-go, on the test broker and on one with
// Kafka's production group settings.
func TestStandbyTermCheckpoint(t *testing.T) {
	for _, c := range []struct {
		name, bin string
		prod      bool
		extra     []string // the service's own flags
	}{
		{"kafka-go", kafkaBin, false, nil},
		{"franz-go", kgoBin, false, nil},
		{"kafka-go-handover-prod", kafkaBin, true, []string{"-group-handover"}},
		{"franz-go-kip848-prod", kgoBin, true, []string{"-balancer", "server"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			if c.prod {
				k = needKafkaProd(t)
			}
			topic, group := k.newTopic("standby-term", 2), uniqueName("standby-term")
			flags := []string{"--idle", "1h", "--group", group, "--topics", topic}
			svc := append(consumerArgs(c.bin, k.brokers, topic, group), c.extra...)
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

			// --on-term stop: the service's own SIGTERM handling commits
			// and leaves; the next start is cold (today's first result
			// after a rollout, for comparison), and nothing is missed.
			// s2's service is the restored one: stop it via its shutdown.
			s2.waitState("running", 60*time.Second)
			if _, err := s2.term(60 * time.Second); err != nil {
				t.Fatalf("the second kcr standby exited with %v after SIGTERM, want 0", err)
			}
			stopFlags := append([]string{"--on-term", "stop"}, flags...)
			s3 := k.startStandbyInit(dir, stopFlags, svc...)
			s3.waitState("standby", 60*time.Second)
			k.produceN(topic, 5)
			s3.waitAllProcessed(topic, 60*time.Second)
			s3.waitState("running", 60*time.Second)
			if _, err := s3.term(60 * time.Second); err != nil {
				t.Fatalf("kcr standby --on-term stop exited with %v after SIGTERM, want 0", err)
			}
			if n := s3.countLogs("standby: shutdown: the service is stopped", "killed", "false"); n != 1 {
				t.Fatalf("%d graceful stops at shutdown logged, want 1", n)
			}
			k.produceN(topic, 5)
			t0 = time.Now()
			s4 := k.startStandbyInit(dir, flags, svc...)
			s4.waitAllProcessed(topic, 60*time.Second)
			if first, ok := s4.firstProcessed(t0); ok {
				t.Logf("after --on-term stop, next start (cold) → first record processed: %v", first.Sub(t0).Round(time.Millisecond))
			}
			if n := s4.countLogs("standby: starting"); n != 1 {
				t.Errorf("%d cold starts after a stop, want 1", n)
			}
			k.waitCommitted(group, topic, k.endOffsets(topic), 60*time.Second)
		})
	}
}

// The shipped manifests give kcr standby's shutdown the time it asks for:
// --term-grace ends before the kubelet's SIGKILL
// (terminationGracePeriodSeconds) and systemd's (TimeoutStopSec), and
// systemd sends SIGTERM to kcr standby alone, killing what is left after
// it (KillMode=mixed), so that the service is never orphaned.
func TestStandbyShutdownManifests(t *testing.T) {
	graceIn := func(args []string) time.Duration {
		for i, a := range args {
			if a == "--term-grace" && i+1 < len(args) {
				d, err := time.ParseDuration(args[i+1])
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
		}
		return 25 * time.Second // standby.DefaultTermGrace
	}
	for _, f := range []string{standbyPodFile, standbyDeploymentFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.NewReplacer("${METRICS_PORT}", "9464", "${ARGS}", "[]", "${IMAGE}", "x").Replace(string(b))
		docs := strings.Split(s, "\n---\n")
		var pod struct {
			Spec struct {
				Template struct {
					Spec podSpec `json:"spec"`
				} `json:"template"`
				podSpec
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(docs[len(docs)-1]), &pod); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		ps := pod.Spec.podSpec
		if len(ps.Containers) == 0 {
			ps = pod.Spec.Template.Spec
		}
		if len(ps.Containers) != 1 || ps.Grace == nil {
			t.Fatalf("%s: want one container and terminationGracePeriodSeconds", f)
		}
		grace := graceIn(append(ps.Containers[0].Command, ps.Containers[0].Args...))
		if limit := time.Duration(*ps.Grace) * time.Second; grace+2*time.Second > limit {
			t.Errorf("%s: --term-grace %v does not end well before terminationGracePeriodSeconds (%v)", f, grace, limit)
		}
	}
	b, err := os.ReadFile("../../deploy/systemd/kcr-standby@.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			unit[k] = v
		}
	}
	stop, err := time.ParseDuration(unit["TimeoutStopSec"])
	if err != nil {
		t.Fatalf("TimeoutStopSec %q: %v", unit["TimeoutStopSec"], err)
	}
	if grace := graceIn(strings.Fields(unit["ExecStart"])); grace+2*time.Second > stop {
		t.Errorf("systemd unit: --term-grace %v does not end well before TimeoutStopSec=%v", grace, stop)
	}
	if unit["KillMode"] != "mixed" || unit["Restart"] != "always" {
		t.Errorf("systemd unit: KillMode=%s Restart=%s, want mixed (SIGTERM to kcr standby, nothing orphaned) and always (docs/failure-modes.md)", unit["KillMode"], unit["Restart"])
	}
}

// podSpec is the part of a pod's spec the shutdown depends on.
type podSpec struct {
	Grace      *int64 `json:"terminationGracePeriodSeconds"`
	Containers []struct {
		Command []string `json:"command"`
		Args    []string `json:"args"`
	} `json:"containers"`
}

// serviceHostPID is the host PID of the one copy of s's service (the
// status names it in kcr standby's own PID namespace).
func (s *sbRun) serviceHostPID() int {
	s.t.Helper()
	abs, _ := filepath.Abs(s.dir)
	var pid int
	eventually(s.t, 60*time.Second, "one copy of the service", func() (bool, string) {
		ms := procfs.NamespaceInitsWith("KCR_STANDBY_DIR=" + abs)
		if len(ms) == 1 {
			pid = ms[0].PID
		}
		return len(ms) == 1, fmt.Sprintf("%d copies", len(ms))
	})
	return pid
}

// The service's exits, with kcr standby as a container's init: a SIGKILL
// is logged as such and counted; an exit 0 (testapp's on SIGTERM) is
// logged with its status at INFO and restarts the service at once,
// uncounted; after --crash-limit failures in a row kcr standby exits
// non-zero, which its own supervisor sees.
func TestStandbyExits(t *testing.T) {
	need(t)
	k := &kafkaEnv{t: t}
	dir := filepath.Join(t.TempDir(), "img")
	s := k.launchStandby(true, dir, []string{"--idle", "1h", "--crash-limit", "3", "--max-backoff", "1s", "--stable-after", "1h"}, appBin)
	s.waitState("running", 60*time.Second)
	syscall.Kill(s.serviceHostPID(), syscall.SIGKILL)
	eventually(t, 60*time.Second, "the SIGKILL logged", func() (bool, string) {
		return s.countLogs("standby: the service exited by itself; restarting it cold", "signal", "SIGKILL", "failures_in_a_row", "1") == 1, ""
	})
	s.waitState("running", 60*time.Second)
	syscall.Kill(s.serviceHostPID(), syscall.SIGTERM)
	eventually(t, 60*time.Second, "the exit 0 logged", func() (bool, string) {
		return s.countLogs("standby: the service exited 0; starting it again cold", "exit_code", "0", "level", "INFO") == 1, ""
	})
	for kills := 0; ; kills++ {
		if kills > 6 {
			t.Fatal("kcr standby runs on after 6 more failures (--crash-limit 3)")
		}
		st, err := s.status()
		if err == nil && st.State == "running" {
			syscall.Kill(s.serviceHostPID(), syscall.SIGKILL)
		}
		select {
		case err := <-s.done:
			s.done <- err
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("kcr standby exited with %v after a crash loop, want status 1", err)
			}
			if n := s.countLogs("standby: crash loop; exiting non-zero", "failures_in_a_row", "3"); n != 1 {
				t.Errorf("%d crash loops logged after 3 failures, want 1", n)
			}
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// A connection that wakes a restored service is answered only once the
// service's own after-restore hooks ran, those registered after
// notify.Listeners included (testapp's 1 s "late" hook): the answer shows
// the hook done for this restore. kcr standby as a container's init.
func TestStandbyListenAfterRestoreHooks(t *testing.T) {
	need(t)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	k := &kafkaEnv{t: t}
	s := k.launchStandby(true, filepath.Join(t.TempDir(), "img"), []string{"--idle", "1s", "--listen", addr}, appBin, "-listen-fds", "-late-hook", "1s")
	s.waitState("standby", 60*time.Second)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 4 || f[1] == "0" || f[3] != "late="+f[1] {
		t.Fatalf("answer %q: want \"counter generation id late=generation\" from the restored copy, its late hook done", line)
	}
}
