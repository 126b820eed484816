package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// podmanSetrlimit says whether a failed podman run is this machine's known
// one: without CAP_SYS_RESOURCE the OCI runtime cannot set the container's
// rlimits (crun: "setrlimit ... Operation not permitted"; runc: "error
// setting rlimit type N: operation not permitted").
func podmanSetrlimit(out string) bool {
	l := strings.ToLower(out)
	return strings.Contains(l, "rlimit") && strings.Contains(l, "operation not permitted")
}

// TestContainerPodman: kcr checkpoint --container through podman (its
// container runs with runc, whose CRIU configuration runs kcr's hook), then
// kcr restore --container from the kcr image as a new container: the hooks
// ran, the copy is a new instance, nothing acknowledged is missing on the
// broker. Podman must be installed; if it cannot start a container here
// only because setting rlimits fails (no CAP_SYS_RESOURCE), the test skips
// and says so; any other failure fails it.
func TestContainerPodman(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed (apt-get install podman; 24 Debian packages, not installed by scripts/test.sh): kcr's podman path is covered by engine's TestPodman* with a stand-in podman only")
	}
	runcPath(t)
	k := needKafka(t)
	topic := k.newTopic("kcr-podman", 1)
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(staticKafkaapp(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "kafkaapp"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "criu.conf")
	mustKCR(t, "install-runtime-hook", "--config", conf, "--hook", filepath.Join(dir, "kcr-criu-hook"))
	name := uniqueName("podman")
	t.Cleanup(func() {
		exec.Command(podman, "rm", "-f", name, name+"-copy").Run()
	})
	// Nothing is pulled: the rootfs is a local directory. Host network, so
	// the loopback broker is reachable; runc, because it hands CRIU the
	// configuration that runs kcr's hook.
	out, err := exec.Command(podman, "--runtime", "runc", "run", "-d", "--name", name, "--rootfs", rootfs,
		"--network", "host", "--ulimit", "host", "--annotation", "org.criu.config="+conf, "-e", "GODEBUG=multipathtcp=0",
		"/kafkaapp", "-brokers", k.brokers, "-topic", topic, "-produce-rate", "200", "-client-id", "podman").CombinedOutput()
	if err != nil && podmanSetrlimit(string(out)) {
		t.Skipf("podman cannot start a container on this machine (setrlimit without CAP_SYS_RESOURCE): %s", strings.TrimSpace(string(out)))
	}
	if err != nil {
		t.Fatalf("podman run: %v: %s", err, out)
	}
	a := &kapp{app: &app{t: t, out: filepath.Join(dir, "app.log"), done: make(chan struct{})}, k: k}
	k.keepLog(a)
	follow := func(ctr string) {
		logf, err := os.OpenFile(a.out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(podman, "logs", "-f", ctr)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
	}
	follow(name)
	ev := a.waitEvent(20*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		t.Fatalf("kafkaapp failed to start in the podman container: %v", ev)
	}
	a.waitAcked(100, 30*time.Second)
	before := a.state()

	img := filepath.Join(t.TempDir(), "img")
	r := mustKCR(t, "checkpoint", "--container", name, "--runtime", "podman", "-o", img)
	if !strings.Contains(r.stderr, "podman checkpoint") {
		t.Errorf("no podman checkpoint phase:\n%s", r.stderr)
	}
	mustKCR(t, "inspect", img)
	ackedBefore := len(acked(a.events()))
	n1 := len(a.events())
	mustKCR(t, "restore", "--container", name+"-copy", "--runtime", "podman", img)
	// The copy logs from its start again: follow it into a fresh file.
	a.logMu.Lock()
	a.out, a.logOff = filepath.Join(dir, "copy.log"), 0
	a.logMu.Unlock()
	follow(name + "-copy")
	after := a.waitAfter(n1, 20*time.Second)
	if after.str("kind") != "restore" {
		t.Fatalf("after kcr restore through podman the hooks ran with kind %q, want restore", after.str("kind"))
	}
	if id := after.str("instance"); id == "" || id == before.Instance {
		t.Errorf("restored instance id %q, before %q: want a new one", id, before.Instance)
	}
	a.waitAcked(ackedBefore+100, 30*time.Second)
	exec.Command(podman, "stop", name+"-copy").Run()
	k.checkAcked(topic, acked(a.events()))
}
