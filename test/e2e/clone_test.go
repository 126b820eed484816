package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runApp starts testapp with kcr run and returns its host PID and log.
func runApp(t *testing.T, args ...string) (pid int, a *app) {
	t.Helper()
	return runAppIn(t, "", args...)
}

// runAppIn is runApp with the service's working directory cwd ("": the
// test's).
func runAppIn(t *testing.T, cwd string, args ...string) (pid int, a *app) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "app.log")
	r := runKCR(t, kcrOpts{must: true, dir: cwd}, append([]string{"run", "--json", "--log", log, "-e", "KCR_SOCKET_DIR=" + filepath.Join(dir, "sock"), "--", appBin}, args...)...)
	var out struct {
		PID    int    `json:"pid"`
		Socket string `json:"socket"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.PID == 0 || out.Socket == "" {
		t.Fatalf("kcr run --json: %v %q", err, r.stdout)
	}
	t.Cleanup(func() { killWait(out.PID) })
	a = &app{t: t, pid: out.PID, out: log}
	ev := a.waitEvent(10*time.Second, func(e event) bool { return e["ev"] == "ready" })
	a.listen, a.sock = ev.str("listen"), ev.str("socket")
	return out.PID, a
}

// kcr run: own PID namespace (init there), own session, stdin /dev/null,
// output appended, MPTCP off.
func TestRunNamespace(t *testing.T) {
	need(t)
	pid, a := runApp(t)
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if !strings.Contains(string(status), "NSpid:\t"+strconv.Itoa(pid)+"\t1\n") {
		t.Fatalf("not init of its own PID namespace:\n%s", status)
	}
	if got := a.events()[0]["pid"].(float64); got != 1 {
		t.Fatalf("getpid() in the service = %v, want 1", got)
	}
	stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	if f[3] != strconv.Itoa(pid) { // session id == pid: session leader
		t.Fatalf("session %s, want %d", f[3], pid)
	}
	if l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/0"); l != "/dev/null" {
		t.Fatalf("stdin is %q, want /dev/null", l)
	}
	env, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if !strings.Contains(string(env), "GODEBUG=multipathtcp=0") {
		t.Fatal("GODEBUG=multipathtcp=0 not set")
	}
	if filepath.Base(a.sock) != "kcr-"+strconv.Itoa(pid)+".sock" {
		t.Fatalf("control socket %s is not named after the host PID %d", a.sock, pid)
	}
	// Checkpoint works on its host PID as before, and it restores.
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(pid))
	r := runKCR(t, kcrOpts{must: true}, "inspect", "--json", img)
	if !strings.Contains(r.stdout, `"pid_namespace": true`) {
		t.Fatal("manifest does not record the PID namespace")
	}
	rpid, _ := restore(t, img)
	if _, _, id := state(t, a.listen); id == "" {
		t.Fatalf("restored service (PID %d) does not answer", rpid)
	}
}

// kcr restore --count 3: three clones side by side, each with its own
// generation, instance id and control socket reachable through its PID.
func TestRestoreClones(t *testing.T) {
	need(t)
	pid, a := runApp(t)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(pid))
	n := len(a.events())

	r := runKCR(t, kcrOpts{must: true}, "restore", "--json", "--count", "3", "--name", "svc", img)
	var doc struct {
		Restores []struct {
			PID        int    `json:"pid"`
			Name       string `json:"name"`
			Generation uint64 `json:"generation"`
			InstanceID string `json:"instance_id"`
			Pending    bool   `json:"hooks_pending"`
		} `json:"restores"`
	}
	err := json.Unmarshal([]byte(r.stdout), &doc)
	clones := doc.Restores
	if err != nil || len(clones) != 3 {
		t.Fatalf("restore --count 3 --json: %v %q", err, r.stdout)
	}
	pids, gens, ids, names := map[int]bool{}, map[uint64]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range clones {
		t.Cleanup(func() { killWait(c.PID) })
		pids[c.PID], gens[c.Generation], ids[c.InstanceID], names[c.Name] = true, true, true, true
		if c.Pending || c.InstanceID == "" || !alive(c.PID) {
			t.Fatalf("clone %+v: not running or hooks not done", c)
		}
	}
	if len(pids) != 3 || len(gens) != 3 || len(ids) != 3 || !names["svc-1"] || !names["svc-3"] {
		t.Fatalf("clones share identity: %+v", clones)
	}
	// Each clone told its own hooks (the app logs after-restore events).
	seen := map[string]bool{}
	for _, e := range a.since(n) {
		if e["ev"] == "after" && e.str("kind") == "restore" {
			seen[e.str("instance")] = true
		}
	}
	for id := range ids {
		if !seen[id] {
			t.Fatalf("instance %s ran no restore hooks (saw %v)", id, seen)
		}
	}
	// Every clone is reachable through its own PID: a leave-running
	// checkpoint of each one works.
	for i, c := range clones {
		runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", filepath.Join(t.TempDir(), "c"+strconv.Itoa(i)), strconv.Itoa(c.PID))
	}
	// Killing one leaves the others running.
	killWait(clones[0].PID)
	time.Sleep(200 * time.Millisecond)
	for _, c := range clones[1:] {
		if !alive(c.PID) {
			t.Fatalf("clone %d died with its sibling", c.PID)
		}
	}
	// An image of a process outside a PID namespace cannot be cloned.
	b := startApp(t)
	img2 := filepath.Join(t.TempDir(), "plain")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", img2, strconv.Itoa(b.pid))
	if r := runKCR(t, kcrOpts{log: logAll}, "restore", "--count", "2", img2); r.code != 5 || !strings.Contains(r.stderr, "kcr run") {
		t.Fatalf("clone of a plain image: exit %d %q, want 5 pointing to kcr run", r.code, r.stderr)
	}
}

// Two services of kcr run (init of their PID namespaces) share a working
// directory, where CRIU's parasite mounts their proc for the dump
// (proc.crtools), and a dump killed there left that directory behind. Both
// are checkpointed at once: kcr removes the leftover and serializes the two
// dumps (CRIU otherwise fails with "Can't create a directory (-17)").
func TestDumpSharedCwd(t *testing.T) {
	need(t)
	cwd := t.TempDir()
	var pids []int
	for range 2 {
		pid, _ := runAppIn(t, cwd)
		pids = append(pids, pid)
	}
	if err := os.Mkdir(filepath.Join(cwd, "proc.crtools"), 0o700); err != nil {
		t.Fatal(err)
	}
	res := make(chan kcrResult, len(pids))
	for _, pid := range pids {
		go func() {
			res <- runKCR(t, kcrOpts{log: logFailed}, "checkpoint", "-o", filepath.Join(t.TempDir(), "img"), strconv.Itoa(pid))
		}()
	}
	for range pids {
		if r := <-res; r.code != 0 {
			t.Errorf("kcr checkpoint of a service sharing its working directory exited %d: %s", r.code, r.stderr)
		}
	}
	if _, err := os.Lstat(filepath.Join(cwd, "proc.crtools")); err == nil {
		t.Error("proc.crtools is left in the services' working directory")
	}
}
