package e2e

// kcr SIGKILLed in the middle of a checkpoint: the Kafka service
// resumes within a moment of kcr's death, not after --resume-after, and the
// broker, read with the test's own client, is missing no record the app saw
// acknowledged.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
		args []string // for kafkaapp
		run  bool     // start kafkaapp with kcr run (PID namespace of its own)
	}{
		// Before the hooks: nothing happened to the app.
		// (CRIU is slow to start, so its answer to the version request
		// that the hooks wait for is late: kcr dies before it connects.)
		{"before-hooks", func(t *testing.T) []string { return []string{"KCR_CRIU=" + slowCRIU(t, 3*time.Second, "swrk")} }, 0, nil, false},
		// During a slow hook: its context is cancelled, every hook resumes.
		{"slow-hook", func(*testing.T) []string { return nil }, 300 * time.Millisecond, []string{"-slow-hook", "20s"}, false},
		// After the hooks, before CRIU is asked to dump.
		{"after-hooks", func(*testing.T) []string { return []string{"KCR_TEST_STALL_AFTER_HOOKS=60s"} }, 300 * time.Millisecond, nil, false},
		// CRIU slow to start: the hooks run only once it answered its
		// version and is ready at its pre-dump stage, so they wait for it;
		// kcr dies after the hooks (stalled there, or it would finish the
		// dump within the 300 ms), while CRIU waits for kcr's go. CRIU dies
		// with kcr: it must never dump the app.
		{"slow-criu", func(t *testing.T) []string {
			return []string{"KCR_CRIU=" + slowCRIU(t, 3*time.Second, "swrk"), "KCR_TEST_STALL_AFTER_HOOKS=60s"}
		}, 300 * time.Millisecond, nil, false},
		// After the hooks, the app under kcr run: SO_PEERCRED gives it PID
		// 0 for kcr, so it watches the PID kcr named in its request.
		{"after-hooks-kcr-run", func(*testing.T) []string { return []string{"KCR_TEST_STALL_AFTER_HOOKS=60s"} }, 300 * time.Millisecond, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			topic := k.newTopic("killed", 3)
			args := append([]string{"-topic", topic, "-produce-rate", "200", "-client-id", "killed"}, c.args...)
			var a *kapp
			if c.run {
				_, a = k.run(args...)
			} else {
				a = k.start(args...)
			}
			a.waitAcked(200, 30*time.Second)
			n0 := len(a.events())
			cmd := kcrOpts{env: c.env(t)}.cmd("checkpoint", "-o", filepath.Join(t.TempDir(), "img"), strconv.Itoa(a.pid))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if c.name == "before-hooks" {
				time.Sleep(time.Second)
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
				base := len(acked(a.events()))
				time.Sleep(4 * time.Second) // past the wrapper's sleep
				if n := count(a.since(n0), "pending") + count(a.since(n0), "after"); n != 0 {
					t.Fatalf("hooks ran although kcr died before it asked for them")
				}
				if len(acked(a.events())) < base+100 {
					t.Fatal("the app stopped producing")
				}
				a.stop(a.pid)
				k.checkAcked(topic, acked(a.events()))
				return
			}
			eventually(t, 20*time.Second, "the before-checkpoint hooks", func() (bool, string) {
				return count(a.since(n0), "pending") > 0, "no pending event yet"
			})
			time.Sleep(c.kill)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			killed := time.Now()
			ev := a.waitAfter(n0, 60*time.Second) // within the app's own timeout (hook budget + 60 s)
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
			// The app saw kcr die (its connection, or its PID gone), not
			// its own timeout: how soon is a measurement (load moves it),
			// in docs/benchmarks.md, "kcr killed at each CRIU stage".
			if strings.Contains(ev.str("reason"), "no follow-up from kcr within") {
				t.Errorf("the app resumed on its timeout (%q), %v after kcr died: it did not see kcr die", ev.str("reason"), resumed)
			}
			if !alive(a.pid) {
				t.Fatal("the app died")
			}
			a.stop(a.pid)
			k.checkAcked(topic, acked(a.events()))
		})
	}
}

// slowCRIU returns a CRIU wrapper that sleeps d before CRIU runs with first
// argument arg ("swrk", "--version").
func slowCRIU(t *testing.T, d time.Duration, arg string) string {
	t.Helper()
	real, err := exec.LookPath("criu")
	if err != nil {
		t.Fatalf("criu: %v", err)
	}
	// A file of its own each time: kcr caches CRIU's version per binary.
	f, err := os.CreateTemp(binDir, "slow-criu-")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := f.Name()
	script := fmt.Sprintf("#!/bin/sh\n[ \"$1\" = %s ] && sleep %.3f\nexec %s \"$@\"\n", arg, d.Seconds(), real)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o755); err != nil { // CreateTemp made it 0600
		t.Fatal(err)
	}
	return p
}

// kcr SIGKILLed after CRIU dumped the app and before the image was
// published: the app is gone, but the image is not lost. "kcr recover"
// finishes it, the restored app produces again, and the broker has every
// record the app saw acknowledged. The image is recovered by the name given
// to -o.
func TestKCRKilledBeforePublish(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("killed-dump", 3)
	a := k.start("-topic", topic, "-produce-rate", "200", "-client-id", "killed-dump")
	a.waitAcked(200, 30*time.Second)
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	cmd := kcrOpts{env: []string{"KCR_TEST_STALL_AFTER_DUMP=60s"}}.cmd("checkpoint", "-o", img, strconv.Itoa(a.pid))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the app was not dumped")
	}
	time.Sleep(100 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if _, err := os.Stat(img); err == nil {
		t.Fatal("an image was published although kcr died before publishing it")
	}
	// An unfinished image is refused by restore.
	if r := runKCR(t, kcrOpts{log: logFailed}, "restore", img); r.code == 0 {
		t.Fatal("restore of the unpublished image succeeded")
	}
	// By the image's own name, as given to -o.
	r := runKCR(t, kcrOpts{must: true}, "recover", img)
	if !strings.Contains(r.stderr, "recovered "+img) {
		t.Fatalf("kcr recover: %q", r.stderr)
	}
	runKCR(t, kcrOpts{must: true}, "inspect", img) // verifies every checksum
	// kcr SIGKILLed during a restore (CRIU slow to start): the orphaned
	// CRIU aborts at its first notification, before forking anything, and
	// the image, untouched, restores afterwards.
	rs := kcrOpts{env: []string{"KCR_CRIU=" + slowCRIU(t, 3*time.Second, "swrk")}}.cmd("restore", img)
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	rs.Process.Signal(syscall.SIGKILL)
	rs.Wait()
	time.Sleep(2500 * time.Millisecond) // past the wrapper's sleep
	if alive(a.pid) {
		t.Fatal("an orphaned CRIU restored the app after kcr died")
	}
	runKCR(t, kcrOpts{must: true}, "inspect", img)
	before := acked(a.events())
	n1 := len(a.events())
	pid, _ := restore(t, img)
	if ev := a.waitAfter(n1, 30*time.Second); ev.str("kind") != "restore" {
		t.Fatalf("after restore: %v", ev)
	}
	a.finish(topic, pid, len(before))
}

// kcr SIGKILLed in the middle of CRIU's dump (a 1 GiB heap makes it take a
// second or more): CRIU goes on to its post-dump notification, finds kcr
// gone, cures its parasite and resumes the tree, and the app resumes; no
// image is published. (criustage_test.go holds CRIU at each stage.)
func TestKCRKilledDuringDump(t *testing.T) {
	need(t)
	a := startApp(t, "-heap-mb", "1024")
	img := filepath.Join(t.TempDir(), "img")
	cmd := kcrOpts{}.cmd("checkpoint", "-o", img, strconv.Itoa(a.pid))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.waitEvent(20*time.Second, func(e event) bool { return e["ev"] == "before" && e.str("name") == "state" })
	time.Sleep(400 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	killed := time.Now()
	// CRIU resumes the tree once it has written the memory it was
	// dumping: how long that takes depends on the machine's load, so the
	// test asserts that the app saw kcr die, not how soon (the figures:
	// docs/benchmarks.md, "kcr killed at each CRIU stage"). Left on its
	// own, it would resume after its timeout (hook budget + 60 s).
	e := a.waitEvent(60*time.Second, func(e event) bool { return e["ev"] == "after" && e.str("name") == "state" })
	resumed := time.Since(killed)
	if e.str("kind") != "resume" || !strings.Contains(e.str("reason"), "exited before its follow-up") {
		t.Fatalf("after kcr died mid-dump: %v, want a resume because kcr exited", e)
	}
	c0, _, _ := state(t, a.listen)
	time.Sleep(100 * time.Millisecond)
	if c1, _, _ := state(t, a.listen); c1 <= c0 || !alive(a.pid) {
		t.Fatal("the app does not run after kcr died mid-dump")
	}
	t.Logf("kcr killed mid-dump: the app resumed %v later", resumed.Round(time.Millisecond))
	if _, err := os.Stat(img); err == nil {
		t.Fatal("an image was published although kcr died mid-dump")
	}
	// And the app can be checkpointed again.
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", filepath.Join(t.TempDir(), "img2"), strconv.Itoa(a.pid))
}

// kcr SIGKILLed in the middle of CRIU's restore work (a 512 MiB heap makes
// the memory restore take a while): the half-built tree is killed, not left
// waiting in CRIU's restorer with the image's PIDs; the image stays
// complete, and a restore started right away (it waits for the aborting
// CRIU) brings the app back producing, with nothing missing on the broker.
func TestKCRKilledDuringRestore(t *testing.T) {
	k := needKafka(t)
	topic := k.newTopic("killed-restore", 3)
	a := k.start("-topic", topic, "-produce-rate", "200", "-client-id", "killed-restore", "-heap-mb", "512")
	a.waitAcked(200, 60*time.Second)
	img := checkpointGone(t, a.pid)
	before := acked(a.events())
	n1 := len(a.events())

	tmp := t.TempDir() // kcr's restore work directory goes here
	rs := kcrOpts{env: []string{"TMPDIR=" + tmp}}.cmd("restore", img)
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { rs.Wait(); close(exited) }()
	// Kill kcr once CRIU has forked the image's PID and is restoring it.
	eventually(t, 30*time.Second, "CRIU restoring the app's PID", func() (bool, string) {
		select {
		case <-exited:
			t.Fatal("kcr restore finished before it could be killed mid-restore")
		default:
		}
		return forkedByCRIU(a.pid), "not yet"
	})
	time.Sleep(50 * time.Millisecond)
	rs.Process.Signal(syscall.SIGKILL)
	<-exited
	killed := time.Now()
	if rs.ProcessState.Success() {
		t.Fatal("kcr restore finished before it was killed")
	}

	// Right away: the restore waits until the aborting CRIU has freed the PID.
	pid, _ := restore(t, img)
	t.Logf("kcr killed mid-restore: restored again %v later", time.Since(killed).Round(time.Millisecond))
	logs, _ := filepath.Glob(filepath.Join(tmp, "kcr-restore-*", "restore.log"))
	if len(logs) != 1 {
		t.Fatalf("restore logs of the killed restore: %v", logs)
	}
	b, err := os.ReadFile(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "Restoring FAILED") {
		t.Fatalf("CRIU did not abort the restore whose kcr died; its log ends:\n%s", lastBytes(string(b), 800))
	}
	// The half-built incarnation never ran the app's code.
	ev := a.waitAfter(n1, 30*time.Second)
	if ev.str("kind") != "restore" || int(num(ev["pid"])) != pid {
		t.Fatalf("after restore: %v", ev)
	}
	for _, e := range a.since(n1) {
		if e["ev"] == "after" && num(e["gen"]) != num(ev["gen"]) {
			t.Fatalf("two incarnations ran their after-restore hooks: %v and %v", ev, e)
		}
	}
	runKCR(t, kcrOpts{must: true}, "inspect", img)
	a.finish(topic, pid, len(before))
}

// forkedByCRIU reports whether pid is a task that CRIU is restoring: its
// parent is "criu swrk".
func forkedByCRIU(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return false
	}
	cmd, _ := os.ReadFile("/proc/" + f[1] + "/cmdline")
	return strings.Contains(string(cmd), "swrk")
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// kcr SIGKILLed while it checkpoints a restored copy of a service under kcr
// run. The copy lives in a time namespace of its own (CRIU restores the
// clocks), so every start time it reads in /proc is shifted from the one
// kcr named in its request; the copy still identifies kcr (by its pidfd,
// SO_PEERPIDFD), sees it die and resumes at once, not after
// --resume-after.
func TestKCRKilledCheckpointingRestored(t *testing.T) {
	need(t)
	pid, a := runApp(t)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(pid))
	rpid, _ := restore(t, img)
	own, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/time", rpid))
	if host, _ := os.Readlink("/proc/self/ns/time"); own == "" || own == host {
		t.Fatalf("the restored copy's time namespace %q is the host's %q: the case needs its own", own, host)
	}
	n0 := len(a.events())
	cmd := kcrOpts{env: []string{"KCR_TEST_STALL_AFTER_HOOKS=60s"}}.cmd("checkpoint", "--resume-after", "60s", "-o", filepath.Join(t.TempDir(), "img2"), strconv.Itoa(rpid))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the restored copy's before-checkpoint hooks", func() (bool, string) {
		return count(a.since(n0), "before") > 0, "none yet"
	})
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	killed := time.Now()
	var ev event
	eventually(t, 30*time.Second, "the restored copy's after-checkpoint hooks", func() (bool, string) {
		for _, e := range a.since(n0) {
			if e["ev"] == "after" {
				ev = e
				return true, ""
			}
		}
		return false, "none yet"
	})
	resumed := time.Since(killed)
	if ev.str("kind") != "resume" || strings.Contains(ev.str("reason"), "no follow-up") {
		t.Fatalf("after kcr died: %v, want a resume on kcr's death", ev)
	}
	t.Logf("kcr killed while checkpointing a restored copy: it resumed %v later (%s)", resumed.Round(time.Millisecond), ev.str("reason"))
	if _, _, id := state(t, a.listen); id == "" || !alive(rpid) {
		t.Fatal("the restored copy does not answer")
	}
}
