package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kcr-dev/kcr/criuaction"
)

// The kubelet of scripts/kubelet-up.sh: static pods from a directory, its
// API on 127.0.0.1:10250 with anonymous access.
const (
	kubeletNode = "kcr-node" // its --hostname-override: static pods' names end in it
	kubeletAPI  = "https://127.0.0.1:10250"
)

// kubeletManifests starts the kubelet (scripts/kubelet-up.sh), stopped
// with everything it created when the test ends (kubelet-down.sh), and
// returns its static pod directory. It runs only during a kubelet test: a
// kubelet removes every pod sandbox of containerd's CRI namespace that is
// not one of its pods, those of the CRI tests included.
func kubeletManifests(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/var/tmp/kcr-kubelet"); err != nil && os.Getenv("KCR_E2E") == "" {
		skipOrFail(t, "no kubelet built (%v): run scripts/install-kubelet.sh", err)
	}
	out, err := exec.Command("../../scripts/kubelet-up.sh").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("scripts/kubelet-up.sh: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("../../scripts/kubelet-down.sh").CombinedOutput(); err != nil {
			t.Errorf("scripts/kubelet-down.sh: %v\n%s", err, out)
		}
	})
	return strings.TrimSpace(string(out))
}

// staticPod writes deploy/kubelet/kafka-service-pod.yaml, filled in, as a
// static pod and removes it when the test ends; it returns the pod's name
// as the kubelet names it.
func staticPod(t *testing.T, manifests, name, image, criuConf string, args []string) string {
	return staticPodOf(t, manifests, name, image, criuConf, "/kafkaapp", args)
}

// staticPodOf is staticPod with the container's command.
func staticPodOf(t *testing.T, manifests, name, image, criuConf, command string, args []string) string {
	t.Helper()
	a, _ := json.Marshal(args)
	return staticPodFrom(t, manifests, "../../deploy/kubelet/kafka-service-pod.yaml", name, map[string]string{
		"${IMAGE}": image, "${CRIU_CONFIG}": criuConf, "${ARGS}": string(a), "${COMMAND}": command})
}

// staticPodFrom writes the manifest file, its placeholders (${NAME} and
// vars) filled in, as the static pod name, removed when the test ends; it
// returns the pod's name as the kubelet names it.
func staticPodFrom(t *testing.T, manifests, file, name string, vars map[string]string) string {
	t.Helper()
	tmpl, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.ReplaceAll(string(tmpl), "${NAME}", name)
	for k, v := range vars {
		y = strings.ReplaceAll(y, k, v)
	}
	if strings.Contains(y, "${") {
		t.Fatalf("%s has a placeholder the test does not fill:\n%s", file, y)
	}
	p := filepath.Join(manifests, name+".yaml")
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	return name + "-" + kubeletNode
}

// kubeletContainer waits for the kubelet to run the pod's container and
// returns its CRI status.
func (c *criEnv) kubeletContainer(pod string) *cri.ContainerStatus {
	c.t.Helper()
	var st *cri.ContainerStatus
	eventually(c.t, 90*time.Second, "the kubelet to run "+pod, func() (bool, string) {
		l, err := c.rt.ListContainers(c.ctx(), &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
			State:         &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING},
			LabelSelector: map[string]string{"io.kubernetes.pod.name": pod}}})
		if err != nil || len(l.Containers) != 1 {
			return false, fmt.Sprintf("ListContainers: %v, %v", l, err)
		}
		s, err := c.rt.ContainerStatus(c.ctx(), &cri.ContainerStatusRequest{ContainerId: l.Containers[0].Id})
		if err != nil {
			return false, err.Error()
		}
		st = s.Status
		return true, ""
	})
	return st
}

// kubeletCheckpoint calls the kubelet's checkpoint API and returns the
// archive it wrote.
func kubeletCheckpoint(t *testing.T, ns, pod, ctr string) string {
	t.Helper()
	cl := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := cl.Post(kubeletAPI+"/checkpoint/"+ns+"/"+pod+"/"+ctr, "", nil)
	if err != nil {
		t.Fatalf("kubelet checkpoint API: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct{ Items []string }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || len(r.Items) != 1 {
		t.Fatalf("kubelet checkpoint API: %s: %s", resp.Status, b)
	}
	return r.Items[0]
}

// kubeletService runs kafkaapp (serviceArgs) in a static pod of the kubelet
// from image and waits until it serves: its pod, container,
// app and state.
func (c *criEnv) kubeletService(t *testing.T, k *kafkaEnv, manifests, image, topic, group, base string) (string, *cri.ContainerStatus, *kapp, appState) {
	t.Helper()
	pod := staticPod(t, manifests, uniqueName("svc"), image, c.conf, serviceArgs(k, topic, group, base))
	st := c.kubeletContainer(pod)
	a := &kapp{app: &app{t: t, out: filepath.Join(c.dir, "app.log"), done: make(chan struct{})}, k: k}
	k.keepLog(a)
	c.follow(st.LogPath, a.out)
	ev := a.waitEvent(60*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		t.Fatalf("kafkaapp failed to start in the kubelet's pod: %v", ev)
	}
	a.listen = ev.str("listen")
	before := k.waitServing(a, topic, group, base)
	return pod, st, a, before
}

// TestKubeletCheckpoint: the kubelet's checkpoint API (POST
// /checkpoint/NS/POD/CONTAINER) on a static pod of the real kubelet, whose
// image it pulled from a registry: kcr's hooks run, told that the
// checkpoint leaves the container running (notify.LeaveRunning), their
// reports are in the archive, and the same instance resumes and goes on
// serving; no acked record is missing.
func TestKubeletCheckpoint(t *testing.T) {
	manifests := kubeletManifests(t)
	c := newCRI(t)
	k := needKafka(t)
	topic, group, base := k.newTopic("kcr-kubelet", 1), uniqueName("kubelet-group"), "kubelet"
	pod, _, a, before := c.kubeletService(t, k, manifests, c.registryImage(), topic, group, base)

	n0 := len(a.events())
	t0 := time.Now()
	archive := kubeletCheckpoint(t, "kcr-e2e", pod, "kafkaapp")
	t.Logf("kubelet checkpoint API took %v: %s", time.Since(t0).Round(time.Millisecond), archive)
	t.Cleanup(func() { os.Remove(archive) })
	checkHookReports(t, tarMember(t, archive, "checkpoint/"+criuaction.ReportsFile), topic, group)
	if !toldLeaveRunning(t, a.since(n0)) {
		t.Error("the kubelet's checkpoint leaves the container running, but the before-checkpoint hooks saw notify.LeaveRunning false")
	}
	resumed := a.waitAfter(n0, 30*time.Second)
	if resumed.str("kind") != "resume" || resumed.str("instance") != before.Instance {
		t.Errorf("after the kubelet's checkpoint: %v, want a resume of instance %s", resumed, before.Instance)
	}
	n1 := len(a.events())
	a.waitProcessed(n1, 20, 30*time.Second)
	if n, _ := strconv.Atoi(os.Getenv("KCR_KUBELET_BENCH")); n > 0 {
		benchKubeletCheckpoint(t, pod, n, "with kcr's hooks")
		n1 = len(a.events())
		defer c.benchKubeletNoHooks(t, k, manifests, n)
	}

	// The pod goes with its manifest: the kubelet stops the container.
	os.Remove(filepath.Join(manifests, strings.TrimSuffix(pod, "-"+kubeletNode)+".yaml"))
	a.waitExit(n1)
	k.checkAcked(topic, acked(a.events()))
}

// TestKubeletRestorePod: a pod whose image is a checkpoint image of kcr
// (kcr checkpoint --container of a kubelet's pod, kcr export --format oci,
// pushed to a registry) starts, through the kubelet and containerd, as a
// restored copy with a new identity that serves; no acked record is
// missing.
func TestKubeletRestorePod(t *testing.T) {
	manifests := kubeletManifests(t)
	c := newCRI(t)
	k := needKafka(t)
	topic, group, base := k.newTopic("kcr-kubelet-restore", 1), uniqueName("kubelet-restore-group"), "kubelet-restore"
	image := c.registryImage()
	_, st, a, before := c.kubeletService(t, k, manifests, image, topic, group, base)

	img := filepath.Join(c.dir, "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--container", st.Id, "--runc-root", criRuncRoot, "-o", img)
	layoutDir := filepath.Join(c.dir, "oci")
	runKCR(t, kcrOpts{must: true}, "export", "--format", "oci", "-o", layoutDir, img)
	ref := pushLayout(t, layoutDir, strings.Split(image, "/")[0]+"/kcr-e2e-checkpoint:1")

	n1 := len(a.events())
	t0 := time.Now()
	restored := staticPod(t, manifests, uniqueName("svc-restored"), ref, c.conf, nil)
	st2 := c.kubeletContainer(restored)
	a.followInto(filepath.Join(c.dir, "copy.log"))
	c.follow(st2.LogPath, a.out)
	checkNewInstance(t, a, n1, before, base, group, topic)
	t.Logf("restore pod created → after-restore hooks done: %v", time.Since(t0).Round(time.Millisecond))
	a.waitProcessed(n1, 50, 30*time.Second)
	t.Logf("restore pod created → 50 records processed: %v", time.Since(t0).Round(time.Millisecond))
	if st2.Annotations["restored"] != "true" {
		t.Errorf("the restored pod's container has annotations %v: containerd did not restore it", st2.Annotations)
	}
	n := len(a.events())
	os.Remove(filepath.Join(manifests, strings.TrimSuffix(restored, "-"+kubeletNode)+".yaml"))
	a.waitExit(n)
	k.checkAcked(topic, acked(a.events()))
}

// benchKubeletCheckpoint (KCR_KUBELET_BENCH=N, for docs/benchmarks.md)
// logs the median of N checkpoint API calls on pod.
func benchKubeletCheckpoint(t *testing.T, pod string, n int, what string) {
	t.Helper()
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		archive := kubeletCheckpoint(t, "kcr-e2e", pod, "kafkaapp")
		ds = append(ds, time.Since(t0))
		os.Remove(archive)
	}
	slices.Sort(ds)
	t.Logf("kubelet checkpoint API %s: median %v of %d (min %v, max %v)", what, ds[len(ds)/2].Round(time.Millisecond), n, ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
}

// benchKubeletNoHooks logs the median of n checkpoint API calls on the
// same service without kcr's action script: CRIU leaves its broker
// connections alone (tcp-close) instead of the hooks closing them.
func (c *criEnv) benchKubeletNoHooks(t *testing.T, k *kafkaEnv, manifests string, n int) {
	t.Helper()
	noHooks := filepath.Join(c.dir, "criu-no-hooks.conf")
	if err := os.WriteFile(noHooks, []byte("tcp-close\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := serviceArgs(k, k.newTopic("kcr-kubelet-nohooks", 1), uniqueName("kubelet-nohooks"), "kubelet-nohooks")
	pod := staticPod(t, manifests, uniqueName("svc-nohooks"), c.registryImage(), noHooks, args)
	st := c.kubeletContainer(pod)
	a := &kapp{app: &app{t: t, out: filepath.Join(c.dir, "app-nohooks.log"), done: make(chan struct{})}, k: k}
	c.follow(st.LogPath, a.out)
	if ev := a.waitEvent(60*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" }); ev["ev"] == "fatal" {
		t.Fatalf("kafkaapp failed to start in the kubelet's pod: %v", ev)
	}
	a.waitProcessed(0, 20, 30*time.Second)
	benchKubeletCheckpoint(t, pod, n, "without kcr's hooks (CRIU tcp-close)")
}

// TestKubeletCheckpointKgo: the kubelet's checkpoint API on a static pod
// of a kgohooks group consumer (kgoapp -consume): told that the checkpoint
// leaves it running, the member stays in the group (the broker lists the
// same member ids after as before: no leave, no rejoin) and resumes.
func TestKubeletCheckpointKgo(t *testing.T) {
	manifests := kubeletManifests(t)
	c := newCRI(t)
	k := needKafka(t)
	topic, group := k.newTopic("kcr-kubelet-kgo", 1), uniqueName("kubelet-kgo-group")
	image := c.registryImage()
	pod := staticPodOf(t, manifests, uniqueName("kgo"), image, c.conf, "/kgoapp",
		[]string{"-brokers", k.brokers, "-topic", topic, "-group", group, "-consume", "-client-id", "kubelet-kgo"})
	st := c.kubeletContainer(pod)
	a := &kapp{app: &app{t: t, out: filepath.Join(c.dir, "app.log"), done: make(chan struct{})}, k: k}
	k.keepLog(a)
	c.follow(st.LogPath, a.out)
	if ev := a.waitEvent(60*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" }); ev["ev"] == "fatal" {
		t.Fatalf("kgoapp failed to start in the kubelet's pod: %v", ev)
	}
	members := func() ([]string, error) {
		g, err := k.describe(group)
		var ids []string
		for _, m := range g.Members {
			ids = append(ids, m.MemberID)
		}
		return ids, err
	}
	var members0 []string
	eventually(t, 60*time.Second, "kgoapp in its group", func() (bool, string) {
		var err error
		members0, err = members() // the group exists once kgoapp joins
		return err == nil && len(members0) == 1, fmt.Sprintf("members %v (%v)", members0, err)
	})

	n0 := len(a.events())
	archive := kubeletCheckpoint(t, "kcr-e2e", pod, "kafkaapp")
	t.Cleanup(func() { os.Remove(archive) })
	if after := a.waitAfter(n0, 30*time.Second); after.str("kind") != "resume" || after.str("reason") != "leave-running" {
		t.Errorf("after the kubelet's checkpoint: %v, want a resume (leave-running)", after)
	}
	if now, err := members(); err != nil || !slices.Equal(now, members0) {
		t.Errorf("group members before the kubelet's checkpoint %v, after %v (%v): want the same member (it left the group)", members0, now, err)
	}
}
