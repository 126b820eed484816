package e2e

// kcr standby end to end: real CRIU, the real broker, kafkaapp and kgoapp
// as the supervised consumers.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// sbRun is a running kcr standby.
type sbRun struct {
	t      *testing.T
	k      *kafkaEnv
	dir    string // --image-dir
	svcLog string // the service's output (its events)
	errLog string // kcr standby's JSON log
	cmd    *exec.Cmd
	done   chan error
	init   bool // kcr standby is init of its own PID namespace (unshare's child)
}

// startStandby starts kcr standby on dir (reused across runs of one test)
// with flags, supervising svc.
func (k *kafkaEnv) startStandby(dir string, flags []string, svc ...string) *sbRun {
	k.t.Helper()
	return k.startStandbyNoKafka(dir, append([]string{"--brokers", k.brokers}, flags...), svc...)
}

// startStandbyNoKafka is startStandby without --brokers.
func (k *kafkaEnv) startStandbyNoKafka(dir string, flags []string, svc ...string) *sbRun {
	k.t.Helper()
	return k.launchStandby(false, dir, flags, svc...)
}

// launchStandby starts kcr standby, as init of its own PID namespace (with
// its own /proc) if init, the way a container's entrypoint runs.
func (k *kafkaEnv) launchStandby(init bool, dir string, flags []string, svc ...string) *sbRun {
	t := k.t
	t.Helper()
	s := &sbRun{t: t, k: k, init: init, dir: dir, svcLog: dir + ".service.log", errLog: fmt.Sprintf("%s.standby-%d.log", dir, time.Now().UnixNano())}
	f, err := os.OpenFile(s.errLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := append([]string{"standby", "--image-dir", dir, "--log", s.svcLog}, flags...)
	args = append(append(args, "--"), svc...)
	s.cmd = kcrOpts{}.cmd(args...)
	if init {
		// --kill-child: kcr standby dies with unshare (the cleanup's kill).
		s.cmd = exec.Command("unshare", append([]string{"--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", kcrBin}, args...)...)
	}
	s.cmd.Stdout, s.cmd.Stderr = f, f
	s.start()
	return s
}

// start starts s.cmd (kcr standby) in a session of its own, and at the
// test's end kills it and every copy of its service.
func (s *sbRun) start() {
	t := s.t
	t.Helper()
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
		// Every copy of the service, as kcr standby finds them (the
		// marker and a PID namespace of its own), not only one the state
		// file names running: a kcr standby killed as it restored or
		// checkpointed leaves one running, which would consume for the
		// rest of the suite.
		if abs, err := filepath.Abs(s.dir); err == nil {
			for _, m := range procfs.NamespaceInitsWith("KCR_STANDBY_DIR=" + abs) {
				killWait(m.PID)
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(s.errLog)
			t.Logf("kcr standby log %s:\n%s", s.errLog, tailLines(string(b), 40))
		}
	})
}

// statePID is the service's PID from the state file, if it runs.
func (s *sbRun) statePID() int {
	b, err := os.ReadFile(filepath.Join(s.dir, "standby.json"))
	if err != nil {
		return 0
	}
	var st struct {
		State string `json:"state"`
		PID   int    `json:"pid"`
	}
	if json.Unmarshal(b, &st) != nil || st.State != "running" {
		return 0
	}
	return st.PID
}

type sbStatus struct {
	State    string       `json:"state"`
	PID      int          `json:"pid"`
	Image    string       `json:"image"`
	LastWake *sbWakePhase `json:"last_wake"`
	Replica  *struct {
		Decision string `json:"decision"`
		Why      string `json:"why"`
	} `json:"replica"`
}

type sbWakePhase struct {
	Source          string             `json:"source"`
	RestoredMS      float64            `json:"restored_ms"`
	HooksDoneMS     float64            `json:"hooks_done_ms"`
	FirstActivityMS float64            `json:"first_activity_ms"`
	Prepared        bool               `json:"prepared"`
	Restore         map[string]float64 `json:"restore"`
}

// checkWakePhases checks the last wake's breakdown: woken by Kafka, from a
// restore prepared while the service slept, its phases in order, and the
// service's first record handed.
func (s *sbRun) checkWakePhases(cycle int) {
	s.t.Helper()
	// kcr standby notes the service's first activity after a wake in the
	// background, polling its activity count: a check right after the
	// results arrived may come first.
	var st sbStatus
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err = s.status()
		if err != nil {
			s.t.Fatalf("cycle %d: status: %v", cycle, err)
		}
		if w := st.LastWake; w == nil || w.FirstActivityMS > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	w := st.LastWake
	if w == nil || w.Source != "kafka" || !w.Prepared || w.RestoredMS <= 0 || w.HooksDoneMS < w.RestoredMS || w.FirstActivityMS < w.HooksDoneMS {
		s.t.Errorf("cycle %d: last wake %+v: want a Kafka wake, prepared ahead, restored, hooks done, first activity, in that order", cycle, w)
	} else if _, ok := w.Restore["verify"]; ok {
		s.t.Errorf("cycle %d: the wake verified the image (%v): it was prepared ahead", cycle, w.Restore)
	}
}

func (s *sbRun) status() (sbStatus, error) {
	out, err := kcrOpts{}.cmd("standby", "status", "--image-dir", s.dir, "--json").Output()
	var st sbStatus
	if err == nil {
		err = json.Unmarshal(out, &st)
	}
	return st, err
}

func (s *sbRun) waitState(want string, timeout time.Duration) sbStatus {
	s.t.Helper()
	var st sbStatus
	eventually(s.t, timeout, "kcr standby state "+want, func() (bool, string) {
		var err error
		st, err = s.status()
		select {
		case werr := <-s.done:
			s.done <- werr
			s.t.Fatalf("kcr standby exited (%v) while waiting for %s", werr, want)
		default:
		}
		return err == nil && st.State == want, fmt.Sprintf("state %q, err %v", st.State, err)
	})
	return st
}

// stop stops kcr standby with sig and waits for it.
func (s *sbRun) stop(sig syscall.Signal) {
	s.t.Helper()
	s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
		s.done <- nil
	case <-time.After(30 * time.Second):
		s.t.Fatalf("kcr standby did not exit on %v", sig)
	}
}

// logs returns kcr standby's JSON records.
func (s *sbRun) logs() []map[string]any {
	f, err := os.Open(s.errLog)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// countLogs counts kcr standby's records whose msg is msg and whose
// attributes include kv.
func (s *sbRun) countLogs(msg string, kv ...string) int {
	n := 0
next:
	for _, m := range s.logs() {
		if m["msg"] != msg {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if fmt.Sprint(m[kv[i]]) != kv[i+1] {
				continue next
			}
		}
		n++
	}
	return n
}

// svcEvents are the service's events (kafkaapp's and kgoapp's JSON lines),
// over every process that ran it.
func (s *sbRun) svcEvents() []event {
	a := &app{t: s.t, out: s.svcLog}
	return a.events()
}

// produceN produces n records to topic, spread over its partitions.
func (k *kafkaEnv) produceN(topic string, n int) {
	k.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-standby-producer"),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Value: []byte(strconv.Itoa(i))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		k.t.Fatal(err)
	}
}

// waitAllProcessed waits until every record of topic was processed by the
// service, and fails on any processed twice.
func (s *sbRun) waitAllProcessed(topic string, timeout time.Duration) {
	s.t.Helper()
	ends := s.k.endOffsets(topic)
	total := 0
	for _, e := range ends {
		total += int(e)
	}
	eventually(s.t, timeout, fmt.Sprintf("all %d records of %s processed", total, topic), func() (bool, string) {
		got := processed(s.svcEvents())
		n := 0
		for p, end := range ends {
			for o := int64(0); o < end; o++ {
				if got[po{p, o}] > 0 {
					n++
				}
			}
		}
		return n == total, fmt.Sprintf("%d of %d", n, total)
	})
	for k, n := range processed(s.svcEvents()) {
		if n > 1 {
			s.t.Errorf("partition %d offset %d processed %d times", k.p, k.o, n)
		}
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func consumerArgs(bin, brokers, topic, group string) []string {
	return []string{bin, "-brokers", brokers, "-topic", topic, "-group", group, "-consume", "-client-id", "standby"}
}

// kcr standby runs a consumer through three idle → checkpoint → lag wake →
// restore cycles on the real broker, with kafka-go (topics given) and
// franz-go (topics taken from the group's commits): one cold start, three
// restores, every record processed exactly once. The same again on the
// broker with Kafka's production group settings, with each client's fast
// path there: franz-go with KIP-848, kafka-go with the group handover.
func TestStandbyCycles(t *testing.T) {
	for _, c := range []struct {
		name, bin string
		topics    bool
		prod      bool
		extra     []string // the service's own flags
	}{
		{"kafka-go", kafkaBin, true, false, nil},
		{"franz-go", kgoBin, false, false, nil},
		{"kafka-go-handover-prod", kafkaBin, true, true, []string{"-group-handover"}},
		{"franz-go-kip848-prod", kgoBin, false, true, []string{"-balancer", "server"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var k *kafkaEnv
			if c.prod {
				k = needKafkaProd(t)
			} else {
				k = needKafka(t)
			}
			topic, group := k.newTopic("standby", 2), uniqueName("standby")
			flags := []string{"--idle", "1s", "--group", group}
			if c.topics {
				flags = append(flags, "--topics", topic)
			} else {
				// The group must have commits for its topics to be known.
				k.produceN(topic, 4)
			}
			dir := filepath.Join(t.TempDir(), "img")
			s := k.startStandby(dir, flags, append(consumerArgs(c.bin, k.brokers, topic, group), c.extra...)...)
			for cycle := 1; cycle <= 3; cycle++ {
				st := s.waitState("standby", 60*time.Second)
				if _, err := os.Stat(filepath.Join(dir, st.Image, "manifest.json")); err != nil {
					t.Fatalf("cycle %d: image %q: %v", cycle, st.Image, err)
				}
				k.produceN(topic, 5)
				s.waitAllProcessed(topic, 60*time.Second)
				s.checkWakePhases(cycle)
			}
			s.waitState("standby", 60*time.Second)
			if n := s.countLogs("standby: starting"); n != 1 {
				t.Errorf("%d cold starts, want 1", n)
			}
			if n := s.countLogs("standby: running", "source", "kafka"); n != 3 {
				t.Errorf("%d restores woken by Kafka lag, want 3", n)
			}
			imgs, _ := filepath.Glob(filepath.Join(dir, "img-*"))
			if len(imgs) != 1 {
				t.Errorf("images %v, want only the newest", imgs)
			}
			for _, e := range s.svcEvents() {
				if e["ev"] == "after" && e["kind"] != "restore" {
					t.Errorf("after-restore event of kind %v, want restore: %v", e["kind"], e)
				}
			}
		})
	}
}

// The failure cases, one service through all of them:
//   - kcr standby killed while the service runs: the service keeps running
//     and consuming; a new kcr standby adopts it;
//   - killed while the service is checkpointed: the image stays, and a new
//     kcr standby restores it on the next record, without a cold start;
//   - the broker down while the service is checkpointed: polls fail, no
//     wake; once it is back, the next record wakes the service;
//   - a restore that fails (a corrupt image): the service starts cold, the
//     image is kept aside;
//   - the service crashes: it is restarted cold.
//
// Nothing is lost or processed twice throughout.
func TestStandbyFailures(t *testing.T) {
	k := needKafka(t)
	topic, group := k.newTopic("standby-fail", 2), uniqueName("standby-fail")
	flags := []string{"--idle", "1s", "--group", group, "--topics", topic, "--poll", "100ms", "--max-backoff", "2s"}
	svc := consumerArgs(kgoBin, k.brokers, topic, group)
	dir := filepath.Join(t.TempDir(), "img")

	// Killed while the service runs.
	s := k.startStandby(dir, append(flags, "--idle", "1h"), svc...)
	st := s.waitState("running", 60*time.Second)
	s.stop(syscall.SIGKILL)
	if !alive(st.PID) {
		t.Fatalf("the service (PID %d) died with kcr standby", st.PID)
	}
	k.produceN(topic, 4)
	s.waitAllProcessed(topic, 60*time.Second)
	s = k.startStandby(dir, flags, svc...)
	if got := s.waitState("running", 30*time.Second); got.PID != st.PID {
		t.Fatalf("the new kcr standby runs PID %d, want the running service %d adopted", got.PID, st.PID)
	}
	if n := s.countLogs("standby: starting"); n != 0 {
		t.Fatalf("the new kcr standby started the service cold (%d)", n)
	}

	// Killed while the service is checkpointed.
	st = s.waitState("standby", 60*time.Second)
	s.stop(syscall.SIGKILL)
	s = k.startStandby(dir, flags, svc...)
	s.waitState("standby", 30*time.Second)
	k.produceN(topic, 4)
	s.waitAllProcessed(topic, 60*time.Second)
	if n := s.countLogs("standby: starting"); n != 0 {
		t.Fatalf("resumed from the kept image with %d cold starts, want 0", n)
	}
	if n := s.countLogs("standby: running", "source", "kafka", "image", st.Image); n != 1 {
		t.Fatalf("%d restores of the kept image %s, want 1", n, st.Image)
	}

	// The broker down while the service is checkpointed.
	s.waitState("standby", 60*time.Second)
	cont := k.stopBroker()
	time.Sleep(3 * time.Second)
	if got, _ := s.status(); got.State != "standby" {
		t.Fatalf("state %q with the broker down, want standby (no wake on errors)", got.State)
	}
	cont()
	eventually(t, 30*time.Second, "the failed polls logged", func() (bool, string) {
		return s.countLogs("standby: kafka wake: broker request failed; watching on, no wake on errors") > 0, ""
	})
	k.produceN(topic, 4)
	s.waitAllProcessed(topic, 60*time.Second)

	// A restore that fails: a corrupt image.
	st = s.waitState("standby", 60*time.Second)
	pages, _ := filepath.Glob(filepath.Join(dir, st.Image, "criu", "pages-*.img"))
	if len(pages) == 0 {
		t.Fatalf("no pages file in %s", st.Image)
	}
	if err := os.WriteFile(pages[0], bytes.Repeat([]byte{0xff}, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	k.produceN(topic, 4)
	s.waitAllProcessed(topic, 60*time.Second)
	if n := s.countLogs("standby: restore failed; starting the service cold", "image", st.Image); n != 1 {
		t.Fatalf("%d failed restores logged, want 1", n)
	}
	bad, _ := filepath.Glob(filepath.Join(dir, "bad-"+st.Image+"-*"))
	if len(bad) != 1 {
		t.Fatalf("the bad image was not kept aside: %v", bad)
	}
	// The corrupt page file fails the image's verification, before CRIU
	// runs: no CRIU log to keep (a CRIU failure's goes with the bad image:
	// TestRestoreWorkKeptAndSwept), and no work directory is left behind.
	if n := s.countLogs("standby: restore failed; starting the service cold", "restore_log", ""); n != 1 {
		t.Fatalf("the failed restore's log line names a CRIU log, but CRIU never ran (%d)", n)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "restore-*")); len(left) != 0 {
		t.Fatalf("restore work directories left: %v", left)
	}

	// The service crashes.
	run := s.waitState("running", 60*time.Second)
	if err := syscall.Kill(run.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "a cold restart after the crash", func() (bool, string) {
		return s.countLogs("standby: starting", "reason", "the service exited") == 1, ""
	})
	k.produceN(topic, 4)
	s.waitAllProcessed(topic, 60*time.Second)
	s.waitState("standby", 60*time.Second)
}

// Socket activation: kcr standby owns --listen and hands it to testapp
// (LISTEN_FDS); connections made while the service is checkpointed queue in
// kcr's socket, wake it, and are all answered by the restored instance
// (warm: its counter and restore generation go on), two cycles in a row.
func TestStandbySocketActivation(t *testing.T) {
	need(t)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	dir := filepath.Join(t.TempDir(), "img")
	k := &kafkaEnv{t: t}
	s := k.startStandbyNoKafka(dir, []string{"--idle", "1s", "--listen", addr}, appBin, "-listen-fds")
	ids := map[string]bool{}
	for cycle := 1; cycle <= 2; cycle++ {
		s.waitState("standby", 60*time.Second)
		const n = 5
		answers := make(chan string, n)
		for range n {
			go func() {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					answers <- "dial: " + err.Error()
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					answers <- "read: " + err.Error()
					return
				}
				answers <- line
			}()
		}
		for range n {
			a := <-answers
			f := strings.Fields(a)
			if len(f) != 3 {
				t.Fatalf("cycle %d: answer %q, want \"counter generation id\"", cycle, a)
			}
			if counter, _ := strconv.Atoi(f[0]); counter == 0 || f[1] == "0" {
				t.Errorf("cycle %d: answer %q from a cold instance, want the restored one", cycle, a)
			}
			ids[f[2]] = true
		}
	}
	s.waitState("standby", 60*time.Second)
	if len(ids) != 2 {
		t.Errorf("instance ids %v, want one per restore", ids)
	}
	if n := s.countLogs("standby: running", "source", "connection"); n != 2 {
		t.Errorf("%d wakes by connection, want 2", n)
	}
	if n := s.countLogs("standby: restore failed; starting the service cold"); n != 0 {
		t.Errorf("%d failed restores", n)
	}
}
