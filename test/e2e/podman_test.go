package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/criuaction"
)

// podmanEnv is a Podman 5 (scripts/install-podman.sh) with kcr's CRIU
// configuration and an image of the hooked service.
type podmanEnv struct {
	t     *testing.T
	bin   string
	image string
	conf  string // CRIU configuration that runs kcr's hook (org.criu.config)
	dir   string
}

func newPodman(t *testing.T) *podmanEnv {
	t.Helper()
	bin, err := exec.LookPath("podman")
	if err != nil {
		skipOrFail(t, "podman is not installed (scripts/install-podman.sh installs Podman 5)")
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version 5.") {
		skipOrFail(t, "podman --version: %q (%v): the tests want Podman 5 (scripts/install-podman.sh)", strings.TrimSpace(string(out)), err)
	}
	p := &podmanEnv{t: t, bin: bin, dir: t.TempDir()}
	p.conf = filepath.Join(p.dir, "criu.conf")
	runKCR(t, kcrOpts{must: true}, "install-runtime-hook", "--config", p.conf, "--hook", filepath.Join(p.dir, "kcr-criu-hook"))
	// No registry: the image is imported from a root filesystem tar. The
	// private Podman's policy.json (install-podman.sh) accepts local tars.
	p.image = "localhost/kcr-e2e:" + uniqueName("img")
	args := []string{"import"}
	prefix := os.Getenv("KCR_PODMAN_PREFIX")
	if prefix == "" {
		prefix = "/opt/kcr/podman"
	}
	if pol := filepath.Join(prefix, "etc", "policy.json"); fileExists(pol) {
		args = append(args, "--signature-policy", pol)
	}
	p.run(append(args, imageTar(t), p.image)...)
	t.Cleanup(func() { exec.Command(bin, "rmi", "-f", p.image).Run() })
	return p
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// run runs podman with args and returns its stdout; it fails the test on
// an error. The restored and started containers keep no stdio of the test.
func (p *podmanEnv) run(args ...string) string {
	p.t.Helper()
	out, err := p.try(args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (p *podmanEnv) try(args ...string) (string, error) {
	cmd := exec.Command(p.bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &runError{err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), nil
}

type runError struct {
	err    error
	stderr string
}

func (e *runError) Error() string { return e.err.Error() + ": " + e.stderr }

// start runs the hooked service in a container named name with runc (the
// CRIU configuration in its org.criu.config annotation), host networking
// (the broker is on loopback) and the host's rlimits (root here cannot
// raise them: no CAP_SYS_RESOURCE).
func (p *podmanEnv) start(k *kafkaEnv, name string, args []string) *kapp {
	p.t.Helper()
	p.t.Cleanup(func() { exec.Command(p.bin, "rm", "-f", "-t", "0", name, name+"-copy", name+"-copy2").Run() })
	p.run(append([]string{"--runtime", "runc", "run", "-d", "--name", name, "--network", "host", "--ulimit", "host",
		"--annotation", "org.criu.config=" + p.conf, "-e", "GODEBUG=multipathtcp=0", "--entrypoint", "/kafkaapp", p.image}, args...)...)
	a := &kapp{app: &app{t: p.t, out: filepath.Join(p.dir, name+".log"), done: make(chan struct{})}, k: k}
	k.keepLog(a)
	p.follow(name, a.out)
	ev := a.waitEvent(30*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		p.t.Fatalf("kafkaapp failed to start in the podman container: %v", ev)
	}
	a.listen = ev.str("listen")
	return a
}

// follow copies a container's log into file (podman logs -f).
func (p *podmanEnv) follow(ctr, file string) {
	p.t.Helper()
	logf, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.bin, "logs", "-f", ctr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
}

// TestContainerPodman: Podman's own checkpoint and restore of a kcr-hooked
// service, as a user runs them: "podman container checkpoint --export" runs
// the before-checkpoint hooks (their reports are in the archive; the broker
// sees the group left), and two "podman container restore --import --name"
// copies of the archive each come back as a new instance with new client
// ids in the group. An independent reader finds every acknowledged record.
func TestContainerPodman(t *testing.T) {
	p := newPodman(t)
	k := needKafka(t)
	topic, group, base := k.newTopic("kcr-podman", 1), uniqueName("podman-group"), "podman"
	name := uniqueName("podman")
	a := p.start(k, name, serviceArgs(k, topic, group, base))
	before := k.waitServing(a, topic, group, base)

	archive := filepath.Join(p.dir, "checkpoint.tar")
	t0 := time.Now()
	p.run("container", "checkpoint", "--export", archive, "--compress", "none", name)
	took := time.Since(t0)
	checkHookReports(t, tarMember(t, archive, "checkpoint/"+criuaction.ReportsFile), topic, group)
	k.waitLeft(group, topic, took)
	if st := strings.TrimSpace(p.run("inspect", "--format", "{{.State.Status}}", name)); st != "exited" {
		t.Errorf("after podman container checkpoint the container is %q, want exited", st)
	}

	// Two copies from the one archive; each logs from the original's start.
	n1 := len(a.events())
	p.run("container", "restore", "--import", archive, "--name", name+"-copy")
	a.followInto(filepath.Join(p.dir, "copy.log"))
	p.follow(name+"-copy", a.out)
	id1 := checkNewInstance(t, a, n1, before, base, group, topic)
	a.waitProcessed(n1, 50, 30*time.Second)

	b := &kapp{app: &app{t: t, out: filepath.Join(p.dir, "copy2.log"), done: make(chan struct{})}, k: k}
	k.keepLog(b)
	p.run("container", "restore", "--import", archive, "--name", name+"-copy2")
	p.follow(name+"-copy2", b.out)
	id2 := checkNewInstance(t, b, 0, before, base, group, topic)
	if id1 == id2 {
		t.Errorf("both copies have client id %s: want one instance each", id1)
	}
	k.waitGroup(group, topic, 60*time.Second, "both copies sharing the group", func(v groupView) bool {
		return len(v.clients) == 2 && len(v.all) == 1
	})
	ackedBefore := len(acked(a.events()))
	a.waitAcked(ackedBefore+100, 30*time.Second)

	na, nb := len(a.events()), len(b.events())
	p.run("stop", "-t", "30", name+"-copy", name+"-copy2")
	a.waitExit(na)
	b.waitExit(nb)
	all := acked(a.events())
	for n, c := range acked(b.events()) {
		all[n] += c
	}
	k.checkAcked(topic, all)
}

// TestContainerPodmanKCR: kcr checkpoint --container through Podman (its
// podman checkpoint --export inside a kcr image) and kcr restore
// --container from the kcr image as a new container: the hooks ran, the
// copy is a new instance, nothing acknowledged is missing on the broker.
func TestContainerPodmanKCR(t *testing.T) {
	p := newPodman(t)
	k := needKafka(t)
	topic, group, base := k.newTopic("kcr-podman-kcr", 1), uniqueName("podman-kcr-group"), "podman-kcr"
	name := uniqueName("podman-kcr")
	a := p.start(k, name, serviceArgs(k, topic, group, base))
	a.waitAcked(100, 30*time.Second)
	before := a.state()

	img := filepath.Join(t.TempDir(), "img")
	t0 := time.Now()
	r := runKCR(t, kcrOpts{must: true}, "checkpoint", "--container", name, "--runtime", "podman", "-o", img)
	took := time.Since(t0)
	if !strings.Contains(r.stderr, "podman checkpoint") {
		t.Errorf("no podman checkpoint phase:\n%s", r.stderr)
	}
	runKCR(t, kcrOpts{must: true}, "inspect", img)
	checkHookReports(t, tarMember(t, filepath.Join(img, "podman-checkpoint.tar"), "checkpoint/"+criuaction.ReportsFile), topic, group)
	k.waitLeft(group, topic, took)

	n1 := len(a.events())
	runKCR(t, kcrOpts{must: true}, "restore", "--container", name+"-copy", "--runtime", "podman", img)
	a.followInto(filepath.Join(p.dir, "copy.log"))
	p.follow(name+"-copy", a.out)
	checkNewInstance(t, a, n1, before, base, group, topic)
	a.waitProcessed(n1, 50, 30*time.Second)
	ackedBefore := len(acked(a.events()))
	a.waitAcked(ackedBefore+100, 30*time.Second)
	n := len(a.events())
	p.run("stop", "-t", "30", name+"-copy")
	a.waitExit(n)
	k.checkAcked(topic, acked(a.events()))
}
