package e2e

// Containers: kafkaapp, built static, runs in a runc container (a bundle
// from "runc spec": its rootfs is a directory with that one binary, no
// network namespace, so it reaches the host's loopback broker) and is
// checkpointed with plain "runc checkpoint". CRIU runs kcr's hooks because
// the container's org.criu.config annotation names a CRIU configuration
// file of the test's own, written by "kcr install-runtime-hook --config":
// /etc/criu/runc.conf, which other runc users read, is never touched.

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

var (
	staticOnce sync.Once
	staticBin  string // kafkaapp, CGO_ENABLED=0
	staticErr  string
)

// staticKafkaapp builds kafkaapp without cgo, so that it runs in a rootfs
// that holds nothing else.
func staticKafkaapp(t *testing.T) string {
	t.Helper()
	staticOnce.Do(func() {
		p := filepath.Join(binDir, "kafkaapp-static")
		cmd := exec.Command("go", "build", "-o", p, "../apps/kafkaapp")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = err.Error() + "\n" + string(out)
			return
		}
		staticBin = p
	})
	if staticBin == "" {
		t.Fatalf("build static kafkaapp: %s", staticErr)
	}
	return staticBin
}

// container is a runc container running kafkaapp.
type container struct {
	*kapp
	t      *testing.T
	id     string
	root   string // runc --root: this test's own state directory
	bundle string
	conf   string // the CRIU configuration file of org.criu.config
}

// removeAtCleanup kills and deletes the runc container id when the test ends.
func (c *container) removeAtCleanup(id string) {
	c.t.Cleanup(func() {
		runc := func(args ...string) { exec.Command("runc", append([]string{"--root", c.root}, args...)...).Run() }
		runc("kill", id, "KILL")
		time.Sleep(100 * time.Millisecond)
		runc("delete", "-f", id)
	})
}

// runcPath returns runc, or fails or skips the test.
func runcPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("runc")
	if err != nil {
		skipOrFail(t, "runc is not installed (scripts/install-runc.sh installs it)")
	}
	return p
}

// newContainer makes a bundle for kafkaapp with args and the CRIU
// configuration of "kcr install-runtime-hook" (with extra flags), and starts it.
func newContainer(t *testing.T, k *kafkaEnv, installFlags []string, args ...string) *container {
	t.Helper()
	runcPath(t)
	bin := staticKafkaapp(t)
	dir := t.TempDir()
	c := &container{t: t, id: uniqueName("ctr"), root: filepath.Join(dir, "runc"), bundle: filepath.Join(dir, "bundle"),
		conf: filepath.Join(dir, "criu.conf")}
	rootfs := filepath.Join(c.bundle, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "kafkaapp"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runc", "spec", "--bundle", c.bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	hook := filepath.Join(dir, "kcr-criu-hook")
	runKCR(t, kcrOpts{must: true}, append([]string{"install-runtime-hook", "--config", c.conf, "--hook", hook}, installFlags...)...)

	var spec map[string]any
	p := filepath.Join(c.bundle, "config.json")
	b, err = os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = append([]any{"/kafkaapp", "-brokers", k.brokers}, toAny(args)...)
	proc["env"] = append(proc["env"].([]any), "GODEBUG=multipathtcp=0")
	delete(proc, "rlimits") // root lacks CAP_SYS_RESOURCE here
	spec["root"].(map[string]any)["readonly"] = false
	linux := spec["linux"].(map[string]any)
	var nss []any
	for _, n := range linux["namespaces"].([]any) {
		if n.(map[string]any)["type"] != "network" {
			nss = append(nss, n)
		}
	}
	linux["namespaces"] = nss
	spec["annotations"] = map[string]any{"org.criu.config": c.conf}
	b, _ = json.MarshalIndent(spec, "", " ")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}

	c.kapp = &kapp{app: &app{t: t, out: filepath.Join(dir, "app.log"), done: make(chan struct{})}, k: k}
	k.keepLog(c.kapp)
	c.removeAtCleanup(c.id)
	c.runc(nil, "run", "-d", "--bundle", c.bundle, c.id)
	ev := c.waitEvent(20*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		t.Fatalf("kafkaapp failed to start in the container: %v", ev)
	}
	c.listen = ev.str("listen")
	c.pid = c.hostPID()
	return c
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// runc runs a runc command whose container output goes through a pipe into
// the app's log: a host file would be outside the container's mount
// namespace, which CRIU cannot dump. It returns runc's exit error.
func (c *container) runc(wantErr *error, args ...string) string {
	c.t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		c.t.Fatal(err)
	}
	logf, err := os.OpenFile(c.out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	go func() { io.Copy(logf, r); r.Close(); logf.Close() }()
	// The container's stdin is a pipe too, closed at once.
	ir, iw, err := os.Pipe()
	if err != nil {
		c.t.Fatal(err)
	}
	iw.Close()
	defer ir.Close()
	var out strings.Builder
	cmd := exec.Command("runc", append([]string{"--root", c.root}, args...)...)
	if args[0] == "checkpoint" {
		// runc's own output, nothing the container keeps.
		cmd.Stdout, cmd.Stderr = &out, &out
		w.Close()
	} else {
		// Files, not writers: the container inherits them, and exec would
		// wait for it to close a pipe of its own.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ir, w, w
	}
	err = cmd.Run()
	w.Close()
	if wantErr != nil {
		*wantErr = err
	} else if err != nil {
		c.t.Fatalf("runc %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// hostPID returns the host PID of the container's init (runc state).
func (c *container) hostPID() int {
	c.t.Helper()
	out, err := exec.Command("runc", "--root", c.root, "state", c.id).Output()
	if err != nil {
		c.t.Fatalf("runc state %s: %v", c.id, err)
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	json.Unmarshal(out, &st)
	return st.Pid
}

// producingContainer starts kafkaapp in a container producing 200 records
// a second, with args, to a new topic name, and waits for 100 of them.
func producingContainer(t *testing.T, name string, args ...string) (topic string, c *container) {
	t.Helper()
	k := needKafka(t)
	topic = k.newTopic(name, 1)
	c = newContainer(t, k, nil, append([]string{"-topic", topic, "-produce-rate", "200"}, args...)...)
	c.waitAcked(100, 30*time.Second)
	return topic, c
}

// mustRun fails the test unless the container is running after what.
func (c *container) mustRun(what string) {
	c.t.Helper()
	if s := c.status(); s != "running" {
		c.t.Fatalf("container %q after %s, want running", s, what)
	}
}

func (c *container) status() string {
	out, err := exec.Command("runc", "--root", c.root, "state", c.id).Output()
	if err != nil {
		return "gone"
	}
	var st struct {
		Status string `json:"status"`
	}
	json.Unmarshal(out, &st)
	return st.Status
}

// restoredTo follows the restored copy's output, written from its start to
// out, and checks that its after-restore hooks ran as a restore (after
// event n1) with a new instance id.
func (c *container) restoredTo(out string, n1 int, before appState) {
	c.t.Helper()
	c.logMu.Lock()
	c.out, c.logOff = out, 0
	c.logMu.Unlock()
	after := c.waitAfter(n1, 20*time.Second)
	if after.str("kind") != "restore" {
		c.t.Fatalf("after the restore the hooks ran with kind %q, want restore", after.str("kind"))
	}
	if id := after.str("instance"); id == "" || id == before.Instance {
		c.t.Errorf("restored instance id %q, before %q: want a new one", id, before.Instance)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestContainerRuncCheckpointRestore: plain "runc checkpoint" runs the
// hooks, "runc restore" gives a new identity, and no record is lost.
func TestContainerRuncCheckpointRestore(t *testing.T) {
	topic, c := producingContainer(t, "runc", "-client-id", "ctr")
	before := c.state()
	n0 := len(c.events())

	img := filepath.Join(t.TempDir(), "img")
	t0 := time.Now()
	c.runc(nil, "checkpoint", "--image-path", img, "--work-path", img, c.id)
	t.Logf("runc checkpoint with the kcr hook: %v", time.Since(t0))
	dumpLog := readFile(t, filepath.Join(img, "dump.log"))
	if !strings.Contains(dumpLog, "pre-dump: before-checkpoint hooks done") {
		t.Fatalf("dump.log does not show kcr's pre-dump hooks:\n%s", dumpLog)
	}
	// The app's last hook ran; records its callers had not handed over yet
	// wait at the Writer's gate and are sent after the restore.
	pending, _ := c.pendingAt(n0)
	if s := c.status(); s != "stopped" && s != "gone" {
		t.Fatalf("after runc checkpoint the container is %q, want it stopped", s)
	}
	ackedBefore := len(acked(c.events()))

	n1 := len(c.events())
	t0 = time.Now()
	c.runc(nil, "restore", "-d", "--image-path", img, "--work-path", img, "--bundle", c.bundle, c.id)
	t.Logf("runc restore with the kcr hook: %v", time.Since(t0))
	after := c.waitAfter(n1, 20*time.Second)
	if after.str("kind") != "restore" {
		t.Fatalf("after runc restore the hooks ran with kind %q, want restore: %v", after.str("kind"), after)
	}
	if id := after.str("instance"); id == "" || id == before.Instance {
		t.Errorf("restored instance id %q, before %q: want a new one", id, before.Instance)
	}
	if w := after.str("writer_client"); w == before.WriterClient || !strings.HasPrefix(w, "ctr-") {
		t.Errorf("writer client id after restore %q, before %q: want a new ctr-… one", w, before.WriterClient)
	}
	if !strings.Contains(readFile(t, filepath.Join(img, "restore.log")), "post-resume: restored") {
		t.Errorf("restore.log does not show kcr's post-resume message")
	}
	c.pid = c.hostPID()
	on := c.finish(topic, c.pid, ackedBefore)
	for _, n := range pending {
		if on[n] == 0 {
			t.Errorf("record %d, pending at the checkpoint, is not on the topic", n)
		}
	}
}

// TestContainerRuncLeaveRunning: --leave-running resumes the same instance,
// and the before-checkpoint hooks are told that the process goes on
// (notify.LeaveRunning), through runc checkpoint and through kcr
// checkpoint --container, both of which run kcr's CRIU action script.
func TestContainerRuncLeaveRunning(t *testing.T) {
	topic, c := producingContainer(t, "runc-leave", "-client-id", "ctr")
	before := c.state()
	n0 := len(c.events())
	img := filepath.Join(t.TempDir(), "img")
	c.runc(nil, "checkpoint", "--leave-running", "--image-path", img, "--work-path", img, c.id)
	after := c.waitAfter(n0, 20*time.Second)
	if after.str("kind") != "resume" || after.str("reason") != "leave-running" {
		t.Fatalf("after runc checkpoint --leave-running: kind %q reason %q, want resume, leave-running", after.str("kind"), after.str("reason"))
	}
	if !toldLeaveRunning(t, c.since(n0)) {
		t.Error("runc checkpoint --leave-running: the before-checkpoint hooks saw notify.LeaveRunning false")
	}
	if w := after.str("writer_client"); w != before.WriterClient {
		t.Errorf("writer client id changed on resume: %q, before %q", w, before.WriterClient)
	}
	c.mustRun("--leave-running")

	n1 := len(c.events())
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--container", c.id, "--runc-root", c.root, "--leave-running", "-o", filepath.Join(t.TempDir(), "img2"))
	if after := c.waitAfter(n1, 20*time.Second); after.str("kind") != "resume" {
		t.Fatalf("after kcr checkpoint --container --leave-running: %v, want a resume", after)
	}
	if !toldLeaveRunning(t, c.since(n1)) {
		t.Error("kcr checkpoint --container --leave-running: the before-checkpoint hooks saw notify.LeaveRunning false")
	}
	c.mustRun("kcr checkpoint --container --leave-running")
	c.finish(topic, c.pid, len(acked(c.events())))
}

// toldLeaveRunning returns what the first before-checkpoint hook in evs
// was told (notify.LeaveRunning), from kafkaapp's or kgoapp's "pending"
// event.
func toldLeaveRunning(t *testing.T, evs []event) bool {
	t.Helper()
	for _, e := range evs {
		if e["ev"] == "pending" {
			b, ok := e["leave_running"].(bool)
			if !ok {
				t.Fatalf("pending event without leave_running: %v", e)
			}
			return b
		}
	}
	t.Fatal("no pending event: the before-checkpoint hooks did not run")
	return false
}

// TestContainerRuncFailingHook: a failing hook makes runc checkpoint fail;
// the container keeps running and producing.
func TestContainerRuncFailingHook(t *testing.T) {
	topic, c := producingContainer(t, "runc-fail", "-fail-checkpoint")
	n0 := len(c.events())
	img := filepath.Join(t.TempDir(), "img")
	var err error
	out := c.runc(&err, "checkpoint", "--image-path", img, "--work-path", img, c.id)
	if err == nil {
		t.Fatalf("runc checkpoint succeeded although a hook failed:\n%s", out)
	}
	dumpLog := readFile(t, filepath.Join(img, "dump.log"))
	if !strings.Contains(dumpLog, "refusing the checkpoint") {
		t.Errorf("dump.log does not name the failing hook:\n%s", dumpLog)
	}
	c.mustRun("a failed checkpoint")
	after := c.waitAfter(n0, 20*time.Second)
	if after.str("kind") != "resume" {
		t.Errorf("after a failed checkpoint: kind %q, want resume", after.str("kind"))
	}
	c.finish(topic, c.pid, len(acked(c.events())))
}

// TestCRIUHookNoSocket: on a tree without a kcr control socket the hook
// does nothing, says so, and lets CRIU go on.
func TestCRIUHookNoSocket(t *testing.T) {
	need(t)
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	for _, action := range []string{"pre-dump", "post-dump", "post-resume", "network-lock"} {
		cmd := kcrOpts{env: []string{"CRTOOLS_SCRIPT_ACTION=" + action, "CRTOOLS_INIT_PID=" + strconv.Itoa(sleep.Process.Pid),
			"KCR_HOOK_STATE_DIR=" + t.TempDir()}}.cmd("criu-hook")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kcr criu-hook %s on a tree without socket: %v\n%s", action, err, out)
		}
		if action == "pre-dump" && !strings.Contains(string(out), "no kcr control socket in the process tree, nothing to do") {
			t.Errorf("pre-dump did not say it had nothing to do:\n%s", out)
		}
	}
	if sleep.ProcessState != nil || syscall.Kill(sleep.Process.Pid, 0) != nil {
		t.Fatalf("the process was disturbed")
	}
	// Run by hand, it explains what it is for.
	r := runKCR(t, kcrOpts{}, "criu-hook")
	if r.code != 2 || !strings.Contains(r.stderr, "CRTOOLS_SCRIPT_ACTION") {
		t.Errorf("kcr criu-hook without CRIU: exit %d, %q", r.code, r.stderr)
	}
}

// TestContainerKCRCheckpointRestore: "kcr checkpoint --container" drives
// runc checkpoint into a kcr image with the hooks' reports in its manifest,
// and "kcr restore --container" restores it and exits although the
// container goes on (runc gets stdio of its own, not kcr's: runKCR reads
// kcr's output through pipes and would wait for the container otherwise).
func TestContainerKCRCheckpointRestore(t *testing.T) {
	topic, c := producingContainer(t, "kcr-ctr", "-client-id", "ctr")
	before := c.state()

	if r := runKCR(t, kcrOpts{}, "checkpoint", "--container", "no-such-ctr", "--runc-root", c.root, "-o", filepath.Join(t.TempDir(), "x")); r.code != 6 {
		t.Errorf("checkpoint of a missing container: exit %d, want 6: %s", r.code, r.stderr)
	}

	img := filepath.Join(t.TempDir(), "img")
	r := runKCR(t, kcrOpts{must: true}, "checkpoint", "--json", "--container", c.id, "--runc-root", c.root, "-o", img)
	var out struct {
		Phases   []struct{ Name string } `json:"phases"`
		Manifest struct {
			Resources []struct{ Name string } `json:"resources"`
			Process   struct{ PID int }       `json:"process"`
		} `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("checkpoint --json: %v\n%s", err, r.stdout)
	}
	var phases []string
	for _, p := range out.Phases {
		phases = append(phases, p.Name)
	}
	if !slices.Contains(phases, "hooks") || !slices.Contains(phases, "runc checkpoint") {
		t.Errorf("phases %v, want hooks and runc checkpoint", phases)
	}
	if len(out.Manifest.Resources) == 0 || out.Manifest.Process.PID != c.pid {
		t.Errorf("manifest: resources %v, PID %d (container init %d): want the hooks' reports and the init's PID", out.Manifest.Resources, out.Manifest.Process.PID, c.pid)
	}
	if !strings.Contains(r.stderr, "runc checkpoint") {
		t.Errorf("no phase lines on stderr:\n%s", r.stderr)
	}
	if s := c.status(); s != "stopped" && s != "gone" {
		t.Fatalf("after kcr checkpoint --container the container is %q, want it stopped", s)
	}
	runKCR(t, kcrOpts{must: true}, "inspect", img) // verifies every file

	// The CRI-O checkpoint archive reads back with checkpointctl.
	archive := filepath.Join(t.TempDir(), "checkpoint.tar")
	runKCR(t, kcrOpts{must: true}, "export", "--format", "cri-o", "-o", archive, img)
	show, err := exec.Command(checkpointctl(t), "show", archive).CombinedOutput()
	if err != nil || !strings.Contains(string(show), c.id[:12]) || !strings.Contains(string(show), "CRI-O") {
		t.Errorf("checkpointctl show %s: %v\n%s", archive, err, show)
	}
	t.Logf("checkpointctl show:\n%s", show)
	checkOCIImage(t, img, c.id)
	ackedBefore := len(acked(c.events()))

	n1 := len(c.events())
	// The restored container writes to a file of its own, from its start.
	restoredOut := filepath.Join(t.TempDir(), "restored.log")
	// CRIU's work directory (restore.log) goes once the restore succeeded.
	tmp := t.TempDir()
	done := make(chan kcrResult, 1)
	go func() {
		done <- runKCR(t, kcrOpts{env: []string{"TMPDIR=" + tmp}}, "restore", "--json", "--container", c.id, "--runc-root", c.root, "--container-output", restoredOut, img)
	}()
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("kcr restore --container did not exit within 30 s: the container holds its output")
	}
	if r.code != 0 {
		t.Fatalf("kcr restore --container: exit %d: %s", r.code, r.stderr)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("a successful kcr restore --container left %v in $TMPDIR", ents)
	}
	c.restoredTo(restoredOut, n1, before)
	c.pid = c.hostPID()
	c.finish(topic, c.pid, ackedBefore)
}

// TestContainerKCRCheckpointFailingHook: a failing hook fails "kcr
// checkpoint --container" with the hooks' exit code, names the hook, leaves
// no image, and the container goes on producing.
func TestContainerKCRCheckpointFailingHook(t *testing.T) {
	topic, c := producingContainer(t, "kcr-ctr-fail", "-fail-checkpoint")
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	r := runKCR(t, kcrOpts{}, "checkpoint", "--container", c.id, "--runc-root", c.root, "-o", img)
	if r.code != 3 || !strings.Contains(r.stderr, "refusing the checkpoint") {
		t.Errorf("kcr checkpoint --container with a failing hook: exit %d, want 3 naming the hook: %s", r.code, r.stderr)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a failed checkpoint left %v", ents)
	}
	c.mustRun("a failed checkpoint")
	c.finish(topic, c.pid, len(acked(c.events())))
}

var (
	cctlOnce sync.Once
	cctlBin  string
	cctlErr  string
)

// checkpointctl installs checkpointctl (v1.3.0: later ones need a go-criu
// the Go proxy does not serve) into the test binaries' directory.
func checkpointctl(t *testing.T) string {
	t.Helper()
	cctlOnce.Do(func() {
		cmd := exec.Command("go", "install", "github.com/checkpoint-restore/checkpointctl@v1.3.0")
		cmd.Env = append(os.Environ(), "GOBIN="+binDir, "GOFLAGS=")
		cmd.Dir = binDir
		if out, err := cmd.CombinedOutput(); err != nil {
			cctlErr = err.Error() + "\n" + string(out)
			return
		}
		cctlBin = filepath.Join(binDir, "checkpointctl")
	})
	if cctlBin == "" {
		t.Fatalf("go install checkpointctl: %s", cctlErr)
	}
	return cctlBin
}

// checkOCIImage exports img as an OCI image layout and reads it back with
// go-containerregistry: CRI-O's checkpoint annotation names the container,
// and the one layer holds the checkpoint archive's files.
func checkOCIImage(t *testing.T, img, name string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oci")
	runKCR(t, kcrOpts{must: true}, "export", "--format", "oci", "-o", dir, img)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("read OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("OCI index: %v, %d manifests, want 1", err, len(im.Manifests))
	}
	oi, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := oi.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Annotations["io.kubernetes.cri-o.annotations.checkpoint.name"]; got != name {
		t.Errorf("annotation io.kubernetes.cri-o.annotations.checkpoint.name = %q, want %q (all: %v)", got, name, m.Annotations)
	}
	layers, err := oi.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v, %d, want 1", err, len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		seen[h.Name] = true
	}
	for _, f := range []string{"config.dump", "spec.dump", "checkpoint/inventory.img"} {
		if !seen[f] {
			t.Errorf("image layer lacks %s: %v", f, seen)
		}
	}
}
