package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// The manifests of kcr standby in a pod: the static pod the test runs and
// the Deployment users apply.
const (
	standbyPodFile        = "../../deploy/kubelet/kcr-standby-pod.yaml"
	standbyDeploymentFile = "../../deploy/kubernetes/kcr-standby-deployment.yaml"
)

// standbyImage builds kcr's image with Podman (scripts/build-image.sh:
// deploy/image/Containerfile, kcr and CRIU), the service's image on it
// with the demo pipeline (deploy/image/Containerfile.service), and pushes
// that to a registry on loopback; it returns its name. Podman compresses
// the layers (go-containerregistry would, in this race-instrumented test,
// in about a minute).
func (c *criEnv) standbyImage() string {
	t := c.t
	base, svc := "localhost/kcr:"+uniqueName("e2e"), "localhost/kcr-standby-e2e:"+uniqueName("svc")
	t.Cleanup(func() { exec.Command("podman", "rmi", "-f", svc, base).Run() })
	build := exec.Command("../../scripts/build-image.sh")
	build.Env = append(os.Environ(), "KCR_IMAGE="+base)
	t0 := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-image.sh: %v\n%s", err, out)
	}
	t.Logf("scripts/build-image.sh (podman build): %v", time.Since(t0).Round(time.Millisecond))
	ctx := t.TempDir()
	if err := os.Link(staticPipeline(t), filepath.Join(ctx, "pipeline")); err != nil {
		t.Fatal(err)
	}
	ref := c.serveRegistry() + "/kcr-standby-e2e:1"
	policy := []string{"--signature-policy", "/opt/kcr/podman/etc/policy.json"}
	if p := os.Getenv("KCR_PODMAN_PREFIX"); p != "" {
		policy[1] = filepath.Join(p, "etc", "policy.json")
	}
	for _, args := range [][]string{
		append([]string{"build", "--quiet", "-f", "../../deploy/image/Containerfile.service", "--build-arg", "KCR_IMAGE=" + base,
			"--build-arg", "SERVICE=pipeline", "-t", svc, ctx}, policy...),
		append([]string{"push", "--quiet", "--tls-verify=false", svc, ref}, policy...),
	} {
		if out, err := exec.Command("podman", args...).CombinedOutput(); err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		c.img.RemoveImage(context.Background(), &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: ref}})
	})
	return ref
}

// staticPipeline builds examples/pipeline without cgo.
func staticPipeline(t *testing.T) string {
	t.Helper()
	p := filepath.Join(binDir, "pipeline-static")
	if fileExists(p) {
		return p
	}
	cmd := exec.Command("go", "build", "-o", p, "../../examples/pipeline")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the pipeline: %v\n%s", err, out)
	}
	return p
}

// standbyPod is kcr standby in a static pod of the kubelet.
type standbyPod struct {
	*sbRun        // its image directory, seen from the host
	name   string // the pod's name, as the kubelet names it
	file   string // its manifest
	port   int    // --metrics
	ctr    *cri.ContainerStatus
}

// runStandbyPod runs deploy/kubelet/kcr-standby-pod.yaml with args (kcr
// standby's flags, --, the service) and hostDir as its image volume, and
// waits for its container.
func (c *criEnv) runStandbyPod(k *kafkaEnv, manifests, image, hostDir string, args []string) *standbyPod {
	t := c.t
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	a, _ := json.Marshal(args)
	n := uniqueName("standby")
	name := staticPodFrom(t, manifests, standbyPodFile, n, map[string]string{"${IMAGE}": image,
		"${HOST_DIR}": hostDir, "${METRICS_PORT}": strconv.Itoa(port), "${ARGS}": string(a)})
	p := &standbyPod{name: name, file: filepath.Join(manifests, n+".yaml"), port: port}
	p.sbRun = &sbRun{t: t, k: k, dir: filepath.Join(hostDir, "img"), svcLog: filepath.Join(hostDir, "img", "service.log"),
		errLog: filepath.Join(c.dir, n+".log")}
	p.ctr = c.kubeletContainer(name)
	c.follow(p.ctr.LogPath, p.errLog)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(p.errLog)
			svc, _ := os.ReadFile(p.svcLog)
			t.Logf("kcr standby in pod %s:\n%s\nits service:\n%s", name, tailLines(string(b), 30), tailLines(string(svc), 10))
		}
	})
	return p
}

// metrics scrapes kcr standby's metrics: each sample by its name and
// labels as printed.
func (p *standbyPod) metrics() map[string]float64 {
	p.t.Helper()
	cl := &http.Client{Timeout: 10 * time.Second}
	res, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.port))
	if err != nil {
		p.t.Fatalf("kcr standby's metrics: %v", err)
	}
	defer res.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// sum adds the samples of metric, all labels.
func sumMetric(m map[string]float64, metric string) float64 {
	s := 0.0
	for k, v := range m {
		if k == metric || strings.HasPrefix(k, metric+"{") {
			s += v
		}
	}
	return s
}

const (
	healthOK  = `kcr_standby_probes_total{probe="healthz",result="ok"}`
	readyOK   = `kcr_standby_probes_total{probe="readyz",result="ok"}`
	kafkaWoke = `kcr_standby_wakes_total{source="kafka"}`
)

// order produces one order (examples/loadgen's format) and waits until an
// independent reader sees its result.
func (k *kafkaEnv) order(orders, results, id string) time.Duration {
	t := k.t
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v, _ := json.Marshal(map[string]any{"id": id, "n": 1, "ts": time.Now().UnixNano()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: orders, Key: []byte(id), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the result of order "+id, func() (bool, string) {
		n := resultCounts(t, k, results)[id]
		return n > 0, fmt.Sprintf("%d results", n)
	})
	return time.Since(t0)
}

// resultCounts reads the results topic to its end: results per order.
func resultCounts(t *testing.T, k *kafkaEnv, results string) map[string]int {
	n := map[string]int{}
	for _, r := range kafkatest.ReadTo(t, 30*time.Second, strings.Split(k.brokers, ","), results, nil, kgo.ClientID("kcr-e2e-reader")) {
		n[string(r.Key)]++
	}
	return n
}

// TestKubeletStandbyPod: kcr standby as the entrypoint of a pod of the real
// kubelet (deploy/kubelet/kcr-standby-pod.yaml, from an image built by
// deploy/image/Containerfile), with liveness and readiness probes every
// second answered by kcr standby: the service sleeps and is woken by Kafka
// lag three times in a pod the kubelet keeps running (one container, no
// restart), and the probes of the sleeping service wake it never. Then the
// pod is deleted while the service sleeps, and a new pod on the same
// volume restores it from its image when the next order comes (a warm
// wake, no cold start). Every order has exactly one result.
func TestKubeletStandbyPod(t *testing.T) {
	t0 := time.Now()
	mark := func(what string) { t.Logf("%v: %s", time.Since(t0).Round(100*time.Millisecond), what) }
	manifests := kubeletManifests(t)
	mark("kubelet up")
	c := newCRI(t)
	k := needKafka(t)
	image := c.standbyImage()
	mark("image built and pushed")
	orders, results := k.newTopic("kubelet-standby-orders", 2), k.newTopic("kubelet-standby-results", 2)
	group := uniqueName("kubelet-standby")
	hostDir := filepath.Join(c.dir, "standby")
	if err := os.Mkdir(hostDir, 0o700); err != nil {
		t.Fatal(err)
	}
	args := []string{"--idle", "1s", "--brokers", k.brokers, "--group", group, "--topics", orders, "--",
		"/usr/local/bin/pipeline", "-brokers", k.brokers, "-group", group, "-in", orders, "-out", results,
		"-client", "franz", "-kgo-balancer", "server", "-warmup", "1s", "-cache-mb", "16", "-stats-every", "0"}
	var ids []string
	p := c.runStandbyPod(k, manifests, image, hostDir, args)
	mark("pod 1 runs")
	for i := range 3 {
		p.waitState("standby", 90*time.Second)
		id := fmt.Sprintf("%s-1-%d", group, i)
		ids = append(ids, id)
		t.Logf("pod 1, order %d: result after %v", i, k.order(orders, results, id).Round(time.Millisecond))
	}
	p.waitState("standby", 60*time.Second)
	mark("pod 1: 3 orders answered, asleep")
	m0 := p.metrics()
	// The kubelet probes every second: its probes of the sleeping service
	// are answered, and wake nothing.
	eventually(t, 30*time.Second, "the kubelet's probes of the sleeping service", func() (bool, string) {
		m := p.metrics()
		return m[healthOK] >= m0[healthOK]+3 && m[readyOK] >= m0[readyOK]+3, fmt.Sprintf("healthz %v, readyz %v", m[healthOK], m[readyOK])
	})
	m := p.metrics()
	if st, err := p.status(); err != nil || st.State != "standby" {
		t.Errorf("after %v probes of the sleeping service: state %q (%v), want standby", m[healthOK]+m[readyOK]-m0[healthOK]-m0[readyOK], st.State, err)
	}
	if sumMetric(m, "kcr_standby_wakes_total") != 3 || m[kafkaWoke] != 3 || sumMetric(m, "kcr_standby_cold_starts_total") != 1 {
		t.Errorf("wakes %v (kafka %v), cold starts %v: want 3 Kafka wakes and 1 cold start", sumMetric(m, "kcr_standby_wakes_total"), m[kafkaWoke], sumMetric(m, "kcr_standby_cold_starts_total"))
	}
	if n := m[`kcr_standby_probes_total{probe="healthz",result="failed"}`]; n != 0 {
		t.Errorf("%v liveness probes failed", n)
	}
	if now := c.kubeletContainer(p.name); now.Id != p.ctr.Id || now.Metadata.Attempt != 0 {
		t.Errorf("the pod's container is %s (attempt %d), was %s: the kubelet restarted it", now.Id, now.Metadata.Attempt, p.ctr.Id)
	}
	checkPodLeastPrivileged(t, c, p, 3)
	mark("pod 1: the service confined, its log in the container's, no zombie")
	if n, _ := strconv.Atoi(os.Getenv("KCR_KUBELET_BENCH")); n > 0 {
		benchStandbyPodAndHost(t, k, p.sbRun, orders, results, group, args, n)
	}

	// The pod goes while its service sleeps; a new one on the same volume
	// restores the service from its image.
	mark("pod 1: probed while asleep")
	os.Remove(p.file)
	c.waitNoContainer(p.name)
	mark("pod 1 deleted")
	p2 := c.runStandbyPod(k, manifests, image, hostDir, args)
	p2.waitState("standby", 90*time.Second)
	mark("pod 2 runs, waiting with the image")
	id := group + "-2-0"
	ids = append(ids, id)
	t.Logf("pod 2, order: result after %v", k.order(orders, results, id).Round(time.Millisecond))
	p2.waitState("standby", 60*time.Second)
	if n := p2.countLogs("standby: starting"); n != 0 {
		t.Errorf("the new pod started the service cold %d times: want a restore from the image", n)
	}
	if n := p2.countLogs("standby: running", "source", "kafka"); n != 1 {
		t.Errorf("the new pod restored the service %d times on Kafka lag, want 1", n)
	}
	if m := p2.metrics(); m[kafkaWoke] != 1 || sumMetric(m, "kcr_standby_cold_starts_total") != 0 {
		t.Errorf("the new pod: %v Kafka wakes, %v cold starts; want 1 and 0", m[kafkaWoke], sumMetric(m, "kcr_standby_cold_starts_total"))
	}
	// Asleep, the service committed everything it took: no result can
	// come after this read.
	counts := resultCounts(t, k, results)
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("order %s has %d results, want 1", id, counts[id])
		}
	}
	for id := range counts {
		if strings.HasPrefix(id, group) && !slices.Contains(ids, id) {
			t.Errorf("a result for order %s, which was never sent", id)
		}
	}
	os.Remove(p2.file)
	c.waitNoContainer(p2.name)
	mark("pod 2 deleted")
}

// waitNoContainer waits until the kubelet has stopped every container of
// the pod.
func (c *criEnv) waitNoContainer(pod string) {
	c.t.Helper()
	eventually(c.t, 60*time.Second, "the kubelet to stop "+pod, func() (bool, string) {
		l, err := c.rt.ListContainers(c.ctx(), &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
			State:         &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING},
			LabelSelector: map[string]string{"io.kubernetes.pod.name": pod}}})
		return err == nil && len(l.Containers) == 0, fmt.Sprintf("ListContainers: %v, %v", l, err)
	})
}

// TestKubeletStandbyManifests decodes
// deploy/kubernetes/kcr-standby-deployment.yaml with the Kubernetes API
// types (an unknown field fails: no API server validates it here) and
// checks that its container is the one TestKubeletStandbyPod runs: the same
// kcr standby command up to its address, the same security context and
// environment, probes on the same paths and port, the image directory
// mounted at the same place.
func TestKubeletStandbyManifests(t *testing.T) {
	b, err := os.ReadFile(standbyDeploymentFile)
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	var pvc corev1.PersistentVolumeClaim
	docs := strings.Split(string(b), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%s: %d documents, want a PersistentVolumeClaim and a Deployment", standbyDeploymentFile, len(docs))
	}
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &pvc); err != nil || pvc.Kind != "PersistentVolumeClaim" {
		t.Fatalf("%s: the PersistentVolumeClaim: %v (kind %q)", standbyDeploymentFile, err, pvc.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &dep); err != nil || dep.Kind != "Deployment" {
		t.Fatalf("%s: the Deployment: %v (kind %q)", standbyDeploymentFile, err, dep.Kind)
	}
	pb, err := os.ReadFile(standbyPodFile)
	if err != nil {
		t.Fatal(err)
	}
	// The placeholders, filled in as valid YAML of their types.
	pod := strings.NewReplacer("${METRICS_PORT}", "9464", "${ARGS}", "[]").Replace(string(pb))
	var sp corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(pod), &sp); err != nil {
		t.Fatalf("%s: %v", standbyPodFile, err)
	}
	dc, pc := dep.Spec.Template.Spec.Containers, sp.Spec.Containers
	if len(dc) != 1 || len(pc) != 1 {
		t.Fatalf("containers: the Deployment has %d, the pod %d; want 1", len(dc), len(pc))
	}
	d, p := dc[0], pc[0]
	if !reflect.DeepEqual(d.Command[:len(d.Command)-1], p.Command[:len(p.Command)-1]) || !strings.HasSuffix(p.Command[len(p.Command)-1], ":9464") {
		t.Errorf("commands differ: the Deployment's %q, the pod's %q", d.Command, p.Command)
	}
	if !reflect.DeepEqual(d.SecurityContext, p.SecurityContext) || !reflect.DeepEqual(d.VolumeMounts, p.VolumeMounts) || !reflect.DeepEqual(d.Env, p.Env) {
		t.Errorf("security context, mounts or environment differ: the Deployment's %+v %+v %+v, the pod's %+v %+v %+v",
			d.SecurityContext, d.VolumeMounts, d.Env, p.SecurityContext, p.VolumeMounts, p.Env)
	}
	for _, pr := range [][2]*corev1.Probe{{d.LivenessProbe, p.LivenessProbe}, {d.ReadinessProbe, p.ReadinessProbe}} {
		if pr[0] == nil || pr[1] == nil || pr[0].HTTPGet == nil || pr[1].HTTPGet == nil || pr[0].HTTPGet.Path != pr[1].HTTPGet.Path || pr[0].HTTPGet.Port != pr[1].HTTPGet.Port {
			t.Errorf("probes differ: the Deployment's %+v, the pod's %+v", pr[0], pr[1])
		}
	}
	if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("the Deployment: strategy %q, replicas %v; want Recreate and 1 (one kcr standby per image directory)", dep.Spec.Strategy.Type, dep.Spec.Replicas)
	}
}

// benchStandbyPodAndHost (KCR_KUBELET_BENCH=N, for docs/benchmarks.md)
// logs wakeprobe's N cycles (order produced while the service sleeps →
// its result read back) against the pod's kcr standby, then against the
// same kcr standby and pipeline on the host, in a group and topics of
// their own.
func benchStandbyPodAndHost(t *testing.T, k *kafkaEnv, pod *sbRun, orders, results, group string, args []string, n int) {
	t.Helper()
	probe := filepath.Join(binDir, "wakeprobe")
	if out, err := exec.Command("go", "build", "-o", probe, "../apps/wakeprobe").CombinedOutput(); err != nil {
		t.Fatalf("build wakeprobe: %v\n%s", err, out)
	}
	run := func(where, dir, orders, results, prefix string) {
		cmd := exec.Command(probe, "-brokers", k.brokers, "-orders", orders, "-results", results, "-cycles", strconv.Itoa(n),
			"-status", kcrBin+" standby status --json --image-dir "+dir, "-timeout", "60s", "-prefix", prefix)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("wakeprobe (%s): %v\n%s", where, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Logf("kcr standby %s, order → result over %d wakes: %s", where, n, lines[len(lines)-1])
	}
	run("in the kubelet's pod", pod.dir, orders, results, uniqueName("bench-pod"))
	hOrders, hResults, hGroup := k.newTopic("host-standby-orders", 2), k.newTopic("host-standby-results", 2), uniqueName("host-standby")
	hArgs := slices.Clone(args)
	for i, a := range hArgs {
		switch a {
		case orders:
			hArgs[i] = hOrders
		case results:
			hArgs[i] = hResults
		case group:
			hArgs[i] = hGroup
		case "/usr/local/bin/pipeline":
			hArgs[i] = staticPipeline(t)
		}
	}
	dash := slices.Index(hArgs, "--")
	h := k.startStandbyNoKafka(filepath.Join(t.TempDir(), "img"), hArgs[:dash], hArgs[dash+1:]...)
	run("on the host", h.dir, hOrders, hResults, uniqueName("bench-host"))
}
