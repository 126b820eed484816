package e2e

// kcr standby killed at the moments where a restart used to leave a second
// copy of the service, or to forget its image, and restarted at once as
// systemd's Restart=always would; and the requests and failures that a
// cycle used to mishandle. Real CRIU, testapp, no broker unless named.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// copyWatch counts, every 10 ms, the copies of a service: processes that
// are init of their own PID namespace and carry KCR_E2E_TAG=tag (every
// restored copy keeps the environment of the cold start).
type copyWatch struct {
	tag  string
	mu   sync.Mutex
	most int
	stop chan struct{}
	done chan struct{}
}

func watchCopies(t *testing.T, tag string) *copyWatch {
	w := &copyWatch{tag: tag, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			n := len(taggedCopies(tag))
			w.mu.Lock()
			w.most = max(w.most, n)
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		w.halt()
		for _, pid := range taggedCopies(tag) {
			killWait(pid)
		}
	})
	return w
}

func (w *copyWatch) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// check fails t if two copies were ever alive at once.
func (w *copyWatch) check(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.most > 1 {
		t.Errorf("%d copies of the service were alive at once, want at most 1", w.most)
	}
}

func taggedCopies(tag string) []int {
	var pids []int
	for _, m := range procfs.NamespaceInitsWith("KCR_E2E_TAG=" + tag) {
		pids = append(pids, m.PID)
	}
	return pids
}

// crashRig is one service under kcr standby, killed and restarted.
type crashRig struct {
	t     *testing.T
	k     *kafkaEnv
	dir   string
	tag   string
	flags []string
	svc   []string
	s     *sbRun
	w     *copyWatch
}

func newCrashRig(t *testing.T, k *kafkaEnv, flags []string, svc ...string) *crashRig {
	tag := uniqueName("crash")
	r := &crashRig{t: t, k: k, dir: filepath.Join(t.TempDir(), "img"), tag: tag,
		flags: append([]string{"-e", "KCR_E2E_TAG=" + tag}, flags...), svc: svc}
	r.w = watchCopies(t, tag)
	r.start()
	return r
}

func (r *crashRig) start() {
	r.s = r.k.startStandbyNoKafka(r.dir, r.flags, r.svc...)
}

// restart SIGKILLs kcr standby and starts it again at once.
func (r *crashRig) restart() {
	r.t.Helper()
	r.s.stop(syscall.SIGKILL)
	r.start()
}

func (r *crashRig) ctl(verb string) {
	r.t.Helper()
	if out, err := (kcrOpts{}).cmd("standby", verb, "--image-dir", r.dir).CombinedOutput(); err != nil {
		r.t.Fatalf("kcr standby %s: %v: %s", verb, err, out)
	}
}

// one waits for exactly one copy and returns its PID.
func (r *crashRig) one() int {
	r.t.Helper()
	var pids []int
	eventually(r.t, 30*time.Second, "one copy of the service", func() (bool, string) {
		pids = taggedCopies(r.tag)
		return len(pids) == 1, fmt.Sprint(pids)
	})
	return pids[0]
}

// settled waits until kcr standby is running or checkpointed (neither
// starting nor restoring) and returns its status.
func (r *crashRig) settled() sbStatus {
	r.t.Helper()
	var st sbStatus
	eventually(r.t, 60*time.Second, "kcr standby settled", func() (bool, string) {
		var err error
		st, err = r.s.status()
		return err == nil && (st.State == "running" || st.State == "standby"), fmt.Sprintf("%q %v", st.State, err)
	})
	return st
}

// waitEvent waits for the service's event ev (with the given name) after
// the first skip of them.
func (r *crashRig) waitEvent(ev, name string, skip int) {
	r.t.Helper()
	eventually(r.t, 60*time.Second, "event "+ev+" "+name, func() (bool, string) {
		n := 0
		for _, e := range r.s.svcEvents() {
			if e["ev"] == ev && (name == "" || e["name"] == name) {
				n++
			}
		}
		return n > skip, fmt.Sprintf("%d", n)
	})
}

// Killed while the restored copy runs its after-restore hooks (CRIU is
// done, the state file still said "standby" before the state machine),
// and killed during the cold start's readiness wait: the next kcr standby
// adopts the copy that runs, and never starts a second one.
func TestStandbyKilledInRestoreAndStart(t *testing.T) {
	need(t)
	t.Run("restore", func(t *testing.T) {
		k := &kafkaEnv{t: t}
		r := newCrashRig(t, k, []string{"--idle", "1h"}, appBin, "-after-delay", "3s")
		r.s.waitState("running", 60*time.Second)
		r.ctl("sleep")
		r.s.waitState("standby", 60*time.Second)
		r.ctl("wake")
		r.waitEvent("after", "slow", 0)
		restored := r.one()
		r.restart()
		st := r.settled()
		if st.State != "running" || st.PID != restored {
			t.Fatalf("after the restart: %s PID %d; want the restored copy (PID %d) adopted", st.State, st.PID, restored)
		}
		// The cycle goes on from there, once the copy finished its
		// after-restore hooks.
		r.waitEvent("slow-done", "", 0)
		r.ctl("sleep")
		r.s.waitState("standby", 60*time.Second)
		r.ctl("wake")
		r.s.waitState("running", 60*time.Second)
		r.w.check(t)
	})
	t.Run("cold-start", func(t *testing.T) {
		k := &kafkaEnv{t: t}
		r := newCrashRig(t, k, []string{"--idle", "1h"}, appBin, "-start-delay", "4s")
		first := r.one() // started, not ready yet
		if st, err := r.s.status(); err != nil || st.State != "starting" {
			t.Fatalf("status %v (%v), want starting", st, err)
		}
		r.restart()
		st := r.s.waitState("running", 60*time.Second)
		if st.PID != first {
			t.Fatalf("running PID %d; want the first copy (PID %d) adopted", st.PID, first)
		}
		r.w.check(t)
	})
}

// Killed right after CRIU's dump took the service (while the image is
// published, or before the state file says so): the next kcr standby
// finishes the image and waits with it, then restores it warm; it does
// not start the service cold.
func TestStandbyKilledAfterDump(t *testing.T) {
	need(t)
	k := &kafkaEnv{t: t}
	r := newCrashRig(t, k, []string{"--idle", "1h"}, appBin, "-heap-mb", "64")
	r.s.waitState("running", 60*time.Second)
	r.ctl("sleep")
	// CRIU's last file: the dump finished, the image is not published.
	// The pages were hashed and synced at CRIU's post-dump stage, so the
	// publication that follows is short: the kill may come after it.
	eventually(t, 60*time.Second, "CRIU's dump finished", func() (bool, string) {
		done, _ := filepath.Glob(filepath.Join(r.dir, ".img-000001.kcr-tmp-*", "criu", "stats-dump"))
		published, _ := filepath.Glob(filepath.Join(r.dir, "img-000001", "criu", "stats-dump"))
		return len(done)+len(published) > 0, ""
	})
	r.s.cmd.Process.Kill()
	r.restart()
	if st := r.settled(); st.State != "standby" || st.Image == "" {
		t.Fatalf("after the restart: %s image %q; want standby with the new image", st.State, st.Image)
	}
	r.ctl("wake")
	r.s.waitState("running", 60*time.Second)
	r.waitEvent("after", "state", 0)
	if n := r.s.countLogs("standby: starting"); n != 0 {
		t.Errorf("%d cold starts after the restart, want 0", n)
	}
	r.w.check(t)
}

// A sleep asked for while the supervisor checks, before the checkpoint,
// that the group has no lag belongs to that cycle: it must not checkpoint
// the service again right after its next wake. Needs the fast broker.
func TestStandbyStaleSleep(t *testing.T) {
	k := needKafka(t)
	topic, group := k.newTopic("standby-stale", 1), uniqueName("standby-stale")
	flags := []string{"--brokers", k.brokers, "--idle", "1h", "--group", group, "--topics", topic, "--poll", "100ms", "--hold-group=false"}
	r := newCrashRig(t, k, flags, consumerArgs(kgoBin, k.brokers, topic, group)...)
	r.s.waitState("running", 60*time.Second)
	// Sleeps, as fast as the socket takes them, until the service is
	// being checkpointed: some land while the lag is checked.
	accepted := 0
	for {
		ok, err := rawControl(r.dir, "sleep")
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		accepted++
	}
	r.s.waitState("standby", 60*time.Second)
	r.ctl("wake")
	r.s.waitState("running", 60*time.Second)
	// No idle checkpoint can come within the hour; a stale sleep would
	// act within one activity poll.
	time.Sleep(3 * time.Second)
	if st, err := r.s.status(); err != nil || st.State != "running" {
		t.Fatalf("3 s after the wake: %v (%v); want still running (%d sleeps accepted before the checkpoint)", st, err, accepted)
	}
	if n := r.s.countLogs("standby: sleep asked for"); n != 1 {
		t.Errorf("%d sleeps acted on, want 1", n)
	}
}

// rawControl sends one command on the control socket and reports whether
// kcr standby accepted it.
func rawControl(dir, cmd string) (bool, error) {
	c, err := net.Dial("unix", filepath.Join(dir, "standby.sock"))
	if err != nil {
		return false, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintln(c, cmd)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return false, err
	}
	return strings.Contains(line, `"ok":true`), nil
}

// A full image directory (a small tmpfs): failed dumps back off
// exponentially instead of freezing the service every --idle, and the
// error names CRIU's log at a path that exists.
func TestStandbyFullImageDir(t *testing.T) {
	need(t)
	mnt := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	k := &kafkaEnv{t: t}
	tag := uniqueName("full")
	w := watchCopies(t, tag)
	s := k.startStandbyNoKafka(filepath.Join(mnt, "img"), []string{"-e", "KCR_E2E_TAG=" + tag, "--idle", "1s"}, appBin, "-heap-mb", "48")
	s.waitState("running", 60*time.Second)
	const msg = "standby: checkpoint refused or failed; the service resumed and runs on"
	eventually(t, 60*time.Second, "a failed checkpoint", func() (bool, string) { return s.countLogs(msg) > 0, "" })
	time.Sleep(20 * time.Second)
	n := s.countLogs(msg)
	// Idle 1 s, then 2, 4, 8, 16: at most 5 attempts in 21 s whatever
	// the dumps take; every --idle would be 7 or more.
	if n > 5 {
		t.Errorf("%d failed checkpoints in about 21 s with --idle 1s; want them to back off", n)
	}
	re := regexp.MustCompile(`\(log: ([^)]+)\)`)
	named := 0
	for _, m := range s.logs() {
		if m["msg"] != msg {
			continue
		}
		// Every CRIU log on a machine without CAP_SYS_RESOURCE has a
		// harmless rlimit refusal: the hint must name the full disk, not
		// blame privileges.
		if e := fmt.Sprint(m["err"]); strings.Contains(e, "capabilit") || strings.Contains(e, "seccomp") {
			t.Errorf("the failed checkpoint's hint blames privileges for a full disk: %s", e)
		}
		if sm := re.FindStringSubmatch(fmt.Sprint(m["err"])); sm != nil {
			named++
			if _, err := os.Stat(sm[1]); err != nil {
				t.Errorf("the error names %s, which is gone: %v", sm[1], err)
			}
		}
	}
	if named == 0 {
		t.Errorf("no failed checkpoint named CRIU's log: %v", s.logs())
	}
	if st, err := s.status(); err != nil || st.State != "running" {
		t.Errorf("status %v (%v), want running", st, err)
	}
	w.check(t)
}

// A wake asked for while the service is being checkpointed (its hooks
// take 2 s) abandons the checkpoint, and the same copy runs on; a --log
// kcr cannot open is refused at once, with one line naming it.
func TestStandbyWakeDuringCheckpointAndBadLog(t *testing.T) {
	need(t)
	k := &kafkaEnv{t: t}
	r := newCrashRig(t, k, []string{"--idle", "1h"}, appBin, "-before-delay", "2s")
	r.s.waitState("running", 60*time.Second)
	r.ctl("sleep")
	r.s.waitState("checkpointing", 30*time.Second)
	r.ctl("wake")
	r.s.waitState("running", 60*time.Second)
	// The wake abandons the checkpoint: the same copy runs on, resumed.
	if n := r.s.countLogs("standby: checkpoint abandoned for a wake; the service resumed", "source", "manual"); n != 1 {
		t.Errorf("%d checkpoints abandoned by the wake, want 1", n)
	}
	if n := r.s.countLogs("standby: running", "source", "manual"); n != 0 {
		t.Errorf("%d restores woken by hand, want none", n)
	}
	r.w.check(t)

	cmd := kcrOpts{}.cmd("standby", "--image-dir", filepath.Join(t.TempDir(), "img2"), "--log", "/nonexistent-kcr-dir/svc.log", "--idle", "1s", "--", appBin)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() {
		out, err = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("kcr standby with a bad --log still runs after 60 s: %s", tailLines(string(out), 5))
	}
	if err == nil || !strings.Contains(string(out), "--log") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("kcr standby --log /nonexistent-kcr-dir/svc.log: %v, %q; want one line naming --log and a non-zero exit", err, out)
	}
}

// Killed while a socket-activated service runs (--listen): the service
// holds the only copy of the listening socket, so the next kcr standby
// takes it back from the service instead of failing to bind the address;
// connections are then answered, and still wake the service after its
// next checkpoint.
func TestStandbyKilledWithListen(t *testing.T) {
	need(t)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	k := &kafkaEnv{t: t}
	r := newCrashRig(t, k, []string{"--idle", "1h", "--listen", addr}, appBin, "-listen-fds")
	first := r.s.waitState("running", 60*time.Second)
	r.restart()
	if st := r.s.waitState("running", 60*time.Second); st.PID != first.PID {
		t.Fatalf("running PID %d after the restart, want %d adopted", st.PID, first.PID)
	}
	answer := func() string {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("no answer on %s: %v", addr, err)
		}
		return line
	}
	answer()
	r.ctl("sleep")
	r.s.waitState("standby", 60*time.Second)
	if f := strings.Fields(answer()); len(f) != 3 || f[1] == "0" {
		t.Fatalf("answer %q after the wake, want one from a restored copy", f)
	}
	eventually(t, 30*time.Second, "the wake by connection logged", func() (bool, string) {
		n := r.s.countLogs("standby: running", "source", "connection")
		return n == 1, fmt.Sprint(n)
	})
	r.w.check(t)
}
