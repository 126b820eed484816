package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
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

// kubeletManifests returns the kubelet's static pod directory, or fails
// (skips outside CI) when no kubelet runs.
func kubeletManifests(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KCR_KUBELET_MANIFESTS")
	if dir == "" {
		dir = "/var/tmp/kcr-kubelet-run/manifests"
	}
	if _, err := os.Stat(dir); err != nil {
		skipOrFail(t, "no kubelet (%v): run scripts/kubelet-up.sh", err)
	}
	return dir
}

// staticPod writes deploy/kubelet/kafka-service-pod.yaml, filled in, as a
// static pod and removes it when the test ends; it returns the pod's name
// as the kubelet names it.
func staticPod(t *testing.T, manifests, name, image, criuConf string, args []string) string {
	t.Helper()
	tmpl, err := os.ReadFile("../../deploy/kubelet/kafka-service-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(args)
	y := strings.NewReplacer("${NAME}", name, "${IMAGE}", image, "${CRIU_CONFIG}", criuConf, "${ARGS}", string(a)).Replace(string(tmpl))
	if strings.Contains(y, "${") {
		t.Fatalf("deploy/kubelet/kafka-service-pod.yaml has a placeholder the test does not fill:\n%s", y)
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
	image := c.registryImage()
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
		benchKubeletCheckpoint(t, pod, n)
		n1 = len(a.events())
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
// logs the median of N checkpoint API calls on pod, whose hooks run.
func benchKubeletCheckpoint(t *testing.T, pod string, n int) {
	t.Helper()
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		archive := kubeletCheckpoint(t, "kcr-e2e", pod, "kafkaapp")
		ds = append(ds, time.Since(t0))
		os.Remove(archive)
	}
	slices.Sort(ds)
	t.Logf("kubelet checkpoint API with kcr's hooks: median %v of %d (min %v, max %v)", ds[len(ds)/2].Round(time.Millisecond), n, ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
}
