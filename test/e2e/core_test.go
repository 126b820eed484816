package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	beforeOrder = []string{"worker", "conn", "state"}
	afterOrder  = []string{"state", "conn", "worker"}
)

// 1. checkpoint → gone → restore → state continues, hooks in order with
// restore, outbound connection reopened.
func TestCheckpointRestore(t *testing.T) {
	echo, a := startEchoApp(t)
	c0, gen0, id0 := state(t, a.listen)
	img := checkpointGone(t, a.pid)
	if alive(a.pid) {
		t.Fatal("PID still alive after checkpoint")
	}
	fi, err := os.Stat(img)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("image dir: %v, mode %v; want 0700", err, fi.Mode())
	}
	if got := names(a.events(), "before"); !slices.Equal(got, beforeOrder) {
		t.Fatalf("before-checkpoint order %v, want %v", got, beforeOrder)
	}
	n := len(a.events())
	accepts := echo.count()

	pid, out := restore(t, img)
	if pid != a.pid {
		t.Fatalf("restored PID %d, want the original %d", pid, a.pid)
	}
	if out["hooks_pending"] != false {
		t.Fatalf("hooks pending after restore: %v", out)
	}
	evs := a.since(n)
	if got := names(evs, "after"); !slices.Equal(got, afterOrder) {
		t.Fatalf("after-restore order %v, want %v (events %v)", got, afterOrder, evs)
	}
	for _, e := range evs {
		if e["ev"] == "after" && (e.str("kind") != "restore" || e["gen"].(float64) != 1 || e["self"] != false) {
			t.Fatalf("after-restore event %v: want kind restore, gen 1, told by kcr", e)
		}
	}
	if echo.count() != accepts+1 {
		t.Fatalf("echo server saw %d new connections after restore, want 1", echo.count()-accepts)
	}
	time.Sleep(200 * time.Millisecond)
	checkRestoredState(t, a.listen, c0, gen0, id0)

	r := runKCR(t, kcrOpts{must: true}, "inspect", "--json", img)
	for _, want := range []string{`"format": "kcr-image"`, `"name": "conn"`, `"freeze+dump"`, `"sha256"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect --json lacks %s", want)
		}
	}
}

// 2. --leave-running → resume; kill; restore → restore.
func TestLeaveRunning(t *testing.T) {
	need(t)
	echo := newEcho(t)
	a := startApp(t, "-echo", echo.addr())
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", img, strconv.Itoa(a.pid))
	if !alive(a.pid) {
		t.Fatal("original died despite --leave-running")
	}
	evs := a.events()
	var kinds []string
	for _, e := range evs {
		if e["ev"] == "after" {
			kinds = append(kinds, e.str("kind")+":"+e.str("reason"))
		}
	}
	if len(kinds) != 3 || !strings.HasPrefix(kinds[0], "resume:leave-running") {
		t.Fatalf("after hooks of the original: %v, want 3 × resume (leave-running)", kinds)
	}
	c0, _, id0 := state(t, a.listen)
	time.Sleep(100 * time.Millisecond)
	if c1, _, id1 := state(t, a.listen); c1 <= c0 || id1 != id0 {
		t.Fatalf("original after resume: counter %d→%d, id %s→%s; want counting on, same id", c0, c1, id0, id1)
	}
	a.kill()
	<-a.done
	n := len(a.events())
	restore(t, img)
	for _, e := range a.since(n) {
		if e["ev"] == "after" && e.str("kind") != "restore" {
			t.Fatalf("restored copy got %v, want restore", e)
		}
	}
	if _, _, id2 := state(t, a.listen); id2 == id0 {
		t.Fatal("restored copy kept the original's instance id")
	}
}

// 3. A failing hook → no image, everything resumed, exit 3 naming it.
func TestFailingHook(t *testing.T) {
	need(t)
	a := startApp(t, "-fail-hook", "conn")
	img := filepath.Join(t.TempDir(), "img")
	r := runKCR(t, kcrOpts{log: logAll}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	if r.code != 3 || !strings.Contains(r.stderr, `"conn"`) || !strings.Contains(r.stderr, "refusing on purpose") {
		t.Fatalf("exit %d, stderr %q: want 3 naming resource \"conn\" and its error", r.code, r.stderr)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("image exists after a failed hook: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(img))
	if len(entries) != 0 {
		t.Fatalf("leftovers next to the image: %v", entries)
	}
	if got := names(a.events(), "before"); !slices.Equal(got, beforeOrder) {
		t.Fatalf("every resource must be notified: before %v", got)
	}
	evs := a.events()
	var resumed []string
	for _, e := range evs {
		if e["ev"] == "after" && e.str("kind") == "resume" {
			resumed = append(resumed, e.str("name"))
		}
	}
	if !slices.Equal(resumed, afterOrder) {
		t.Fatalf("resumed %v, want %v", resumed, afterOrder)
	}
	if !alive(a.pid) {
		t.Fatal("app died")
	}
}

// 4. An unhooked TCP connection → refused, app resumes, hint --tcp-close;
// with --tcp-close it works. An MPTCP listener is named with the fix.
func TestUnhookedTCP(t *testing.T) {
	need(t)
	extra := newEcho(t)
	a := startApp(t, "-unhooked", extra.addr())
	img := filepath.Join(t.TempDir(), "img")
	r := runKCR(t, kcrOpts{log: logAll}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	if r.code != 4 || !strings.Contains(r.stderr, "TCP") || !strings.Contains(r.stderr, extra.addr()) || !strings.Contains(r.stderr, "--tcp-close") {
		t.Fatalf("exit %d, stderr %q: want 4 naming the TCP connection to %s and suggesting --tcp-close", r.code, r.stderr, extra.addr())
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatal("image written despite failure")
	}
	a.waitEvent(5*time.Second, func(e event) bool { return e["ev"] == "after" && e.str("kind") == "resume" })
	c0, _, _ := state(t, a.listen)
	time.Sleep(100 * time.Millisecond)
	if c1, _, _ := state(t, a.listen); c1 <= c0 {
		t.Fatal("app stopped working after a refused dump")
	}

	runKCR(t, kcrOpts{must: true}, "checkpoint", "--tcp-close", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	restore(t, img)
	if c, _, _ := state(t, a.listen); c < c0 {
		t.Fatalf("restored counter %d < %d", c, c0)
	}
}

func TestMPTCPListener(t *testing.T) {
	need(t)
	a := startApp(t, "-mptcp")
	r := runKCR(t, kcrOpts{log: logAll}, "checkpoint", "-o", filepath.Join(t.TempDir(), "img"), strconv.Itoa(a.pid))
	if r.code == 0 || !strings.Contains(r.stderr, "MPTCP") || !strings.Contains(r.stderr, "multipathtcp=0") {
		t.Fatalf("exit %d, stderr %q: want failure naming MPTCP and GODEBUG=multipathtcp=0", r.code, r.stderr)
	}
	if len(names(a.events(), "before")) != 0 {
		t.Fatal("hooks ran although the dump could never succeed")
	}
}

// 5. kcr killed after the hooks → the app resumes by itself at once.
func TestKilledCLI(t *testing.T) {
	need(t)
	a := startApp(t)
	cmd := kcrOpts{env: []string{"KCR_TEST_STALL_AFTER_HOOKS=60s"}}.cmd("checkpoint", "--resume-after", "2s", "-o", filepath.Join(t.TempDir(), "img"), strconv.Itoa(a.pid))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.waitEvent(10*time.Second, func(e event) bool { return e["ev"] == "before" && e.str("name") == "state" })
	time.Sleep(100 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	killed := time.Now()
	e := a.waitEvent(10*time.Second, func(e event) bool { return e["ev"] == "after" && e.str("name") == "state" })
	if e.str("kind") != "resume" || !strings.Contains(e.str("reason"), "exited before its follow-up") {
		t.Fatalf("after kcr died: %v, want resume because kcr exited", e)
	}
	// The reason says the app watched kcr's PID rather than wait for
	// --resume-after; how soon is a measurement, not asserted here.
	t.Logf("app resumed %v after kcr died", time.Since(killed).Round(time.Millisecond))
	c0, _, _ := state(t, a.listen)
	time.Sleep(100 * time.Millisecond)
	if c1, _, _ := state(t, a.listen); c1 <= c0 {
		t.Fatal("app not working after resuming on its own")
	}
	// A new checkpoint works afterwards (the cycle ended).
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", filepath.Join(t.TempDir(), "img2"), strconv.Itoa(a.pid))
}

// 6. Bad input: each its own clear error and non-zero exit.
func TestBadInput(t *testing.T) {
	need(t)
	sleep := exec.Command("sleep", "30")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()

	a := startApp(t)
	good := filepath.Join(t.TempDir(), "good")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", good, strconv.Itoa(a.pid))

	flipped := copyImage(t, good)
	flipByte(t, flipped)
	noManifest := copyImage(t, good)
	os.Remove(filepath.Join(noManifest, "manifest.json"))
	empty := t.TempDir()

	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no such pid", []string{"checkpoint", "999999"}, 6, "no such process"},
		{"not a pid", []string{"checkpoint", "abc"}, 2, "not a PID"},
		{"no socket", []string{"checkpoint", strconv.Itoa(sleep.Process.Pid)}, 6, "--no-hooks"},
		{"flipped byte", []string{"restore", flipped}, 5, "sha256 mismatch"},
		{"empty dir", []string{"restore", empty}, 5, "empty"},
		{"no manifest", []string{"restore", noManifest}, 5, "manifest.json missing"},
		{"missing image", []string{"restore", filepath.Join(empty, "nope")}, 5, "does not exist"},
		{"missing archive", []string{"import", filepath.Join(empty, "nope.tar.zst"), "-o", filepath.Join(empty, "i")}, 5, "does not exist: check the archive path"},
		// Other missing files are input errors, not a missing image.
		{"missing key", []string{"restore", "--verify-key", filepath.Join(empty, "k.pub"), good}, 2, "k.pub: bad key file: no such file or directory"},
		{"missing bundle", []string{"restore", "--container", "c", "--bundle", filepath.Join(empty, "b"), good}, 2, "no config.json in it"},
		{"missing program", []string{"run", "--", filepath.Join(empty, "prog")}, 2, "prog\": no such file or directory"},
		{"missing output directory", []string{"export", good, "-o", filepath.Join(empty, "d", "a.tar.zst")}, 2, "no such file or directory: create it first"},
	}
	for _, c := range cases {
		r := runKCR(t, kcrOpts{log: logAll}, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: exit %d stderr %q; want exit %d containing %q", c.name, r.code, r.stderr, c.code, c.want)
		}
		if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 && c.code != 2 {
			t.Errorf("%s: error spans %d lines, want one", c.name, n+1)
		}
	}
	// --no-hooks dumps a process without a socket.
	img := filepath.Join(t.TempDir(), "sleep")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--no-hooks", "--leave-running", "-o", img, strconv.Itoa(sleep.Process.Pid))
	runKCR(t, kcrOpts{must: true}, "inspect", img)
}

func copyImage(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	return dst
}

func flipByte(t *testing.T, img string) {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(img, "criu", "pages-*.img"))
	if len(matches) == 0 {
		t.Fatal("no pages image")
	}
	f, err := os.OpenFile(matches[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, 100)
	b[0] ^= 0xff
	f.WriteAt(b, 100)
}

// 7. A peer with another uid is refused.
func TestPeerCredentials(t *testing.T) {
	need(t)
	a := startApp(t)
	dial := func() (int, string) {
		cmd := exec.Command(appBin, "-dial", a.sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	// The socket's directory and file modes stop the stranger first.
	for p := filepath.Dir(a.sock); p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o711)
	}
	if fi, _ := os.Stat(a.sock); fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if code, out := dial(); code != 3 {
		t.Fatalf("stranger on a 0600 socket: exit %d %q, want EACCES", code, out)
	}
	// With the file opened up, the peer-credential check refuses it.
	os.Chmod(a.sock, 0o666)
	if code, out := dial(); code != 4 || !strings.Contains(out, "permission denied") {
		t.Fatalf("stranger: exit %d %q, want refusal by peer credentials", code, out)
	}
	b, _ := os.ReadFile(a.out)
	if !strings.Contains(string(b), "refused peer") {
		t.Fatal("refusal not logged")
	}
	// Root is still served.
	cmd := exec.Command(appBin, "-dial", a.sock)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "info") {
		t.Fatalf("root: %v %q", err, out)
	}
}

// 8. One image restored twice in sequence: distinct generations.
func TestRestoreTwice(t *testing.T) {
	need(t)
	a := startApp(t)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	pid1, out1 := restore(t, img)
	_, gen1, id1 := state(t, a.listen)
	killWait(pid1)
	pid2, out2 := restore(t, img)
	_, gen2, id2 := state(t, a.listen)
	if pid1 != pid2 {
		t.Fatalf("restores got PIDs %d and %d", pid1, pid2)
	}
	if gen1 == gen2 || id1 == id2 || out1["generation"] == out2["generation"] {
		t.Fatalf("two restores share identity: gen %d/%d id %s/%s", gen1, gen2, id1, id2)
	}
}
