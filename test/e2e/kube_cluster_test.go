package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// kubeEnv is the control plane of scripts/kube-up.sh (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler on loopback) with the kubelet of
// kubelet-up.sh registered as its node, and a namespace of the test.
type kubeEnv struct {
	t    *testing.T
	cs   *kubernetes.Clientset
	home string // KCR_KUBE_HOME: the PersistentVolumes live in its volumes/
	ns   string // namespace's
}

// newKube starts the control plane and the kubelet as its node (both
// stopped, with everything they created, when the test ends).
func newKube(t *testing.T) *kubeEnv {
	t.Helper()
	script := func(name string, env ...string) string {
		cmd := exec.Command("../../scripts/" + name)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("scripts/%s: %v\n%s", name, err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	down := func(name string) {
		if out, err := exec.Command("../../scripts/" + name).CombinedOutput(); err != nil {
			t.Errorf("scripts/%s: %v\n%s", name, err, out)
		}
	}
	t0 := time.Now()
	t.Cleanup(func() { down("kube-down.sh") })
	kubeconfig := script("kube-up.sh")
	t.Logf("scripts/kube-up.sh: %v", time.Since(t0).Round(time.Millisecond))
	home := filepath.Dir(kubeconfig)
	t.Cleanup(func() { down("kubelet-down.sh") })
	script("kubelet-up.sh", "KCR_KUBELET_KUBECONFIG="+filepath.Join(home, "kubelet.kubeconfig"))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// The certificates in memory: client-go caches transports by the CA
	// file's path, and each kube-up.sh makes a new CA at the same path.
	if err := rest.LoadTLSFiles(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.CAFile, cfg.CertFile, cfg.KeyFile = "", "", ""
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the kubelet to register node "+kubeletNode, func() (bool, string) {
		_, err := cs.CoreV1().Nodes().Get(context.Background(), kubeletNode, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return &kubeEnv{t: t, cs: cs, home: home}
}

// namespace creates a namespace labelled for Pod Security's privileged
// level, deleted with its pods when t ends (before the kubelet stops),
// and returns the cluster bound to t and that namespace.
func (k0 *kubeEnv) namespace(t *testing.T) *kubeEnv {
	t.Helper()
	k := &kubeEnv{t: t, cs: k0.cs, home: k0.home, ns: uniqueName("kcr-e2e")}
	cs := k.cs
	_, err := cs.CoreV1().Namespaces().Create(k.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		cs.CoreV1().Namespaces().Delete(ctx, k.ns, metav1.DeleteOptions{})
		eventually(t, 2*time.Minute, "the pods of namespace "+k.ns+" to go", func() (bool, string) {
			l, err := cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0, fmt.Sprintf("%v pods, %v", podNames(l), err)
		})
	})
	return k
}

func (k *kubeEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	k.t.Cleanup(cancel)
	return ctx
}

func podNames(l *corev1.PodList) []string {
	if l == nil {
		return nil
	}
	var n []string
	for _, p := range l.Items {
		n = append(n, p.Name+"("+string(p.Status.Phase)+")")
	}
	return n
}

// hostPathPV creates a PersistentVolume under the control plane's
// volumes/ directory, bound ahead to the claim ns/claim, deleted when the
// test ends; it returns its directory.
func (k *kubeEnv) hostPathPV(claim string, size resource.Quantity) string {
	t := k.t
	dir := filepath.Join(k.home, "volumes", k.ns+"-"+claim)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: k.ns + "-" + claim},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: k.ns, Name: claim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: dir, Type: new(corev1.HostPathDirectory)}},
		},
	}
	if _, err := k.cs.CoreV1().PersistentVolumes().Create(k.ctx(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.cs.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	return dir
}

// apply applies obj (with its apiVersion and kind) by server-side apply,
// as kubectl apply --server-side does.
func (k *kubeEnv) apply(obj any, patch func(ctx context.Context, name string, data []byte) error) {
	k.t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		k.t.Fatal(err)
	}
	var meta struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	json.Unmarshal(b, &meta)
	if err := patch(k.ctx(), meta.Metadata.Name, b); err != nil {
		k.t.Fatalf("server-side apply of %s: %v", meta.Metadata.Name, err)
	}
}

var applyOpts = metav1.PatchOptions{FieldManager: "kcr-e2e", Force: new(true)}

// applyDeployment reads deploy/kubernetes/kcr-standby-deployment.yaml, fits
// it to the test's cluster with fit, and applies its claim and its
// Deployment to the namespace.
func (k *kubeEnv) applyDeployment(fit func(*corev1.PersistentVolumeClaim, *appsv1.Deployment)) (*corev1.PersistentVolumeClaim, *appsv1.Deployment) {
	pvc, dep := readStandbyManifest(k.t)
	pvc.Namespace, dep.Namespace = k.ns, k.ns
	fit(pvc, dep)
	k.apply(pvc, func(ctx context.Context, name string, data []byte) error {
		_, err := k.cs.CoreV1().PersistentVolumeClaims(k.ns).Patch(ctx, name, types.ApplyPatchType, data, applyOpts)
		return err
	})
	k.apply(dep, func(ctx context.Context, name string, data []byte) error {
		_, err := k.cs.AppsV1().Deployments(k.ns).Patch(ctx, name, types.ApplyPatchType, data, applyOpts)
		return err
	})
	return pvc, dep
}

// runningPod waits until one pod of the selector, other than those in
// not, runs with its container ready, and returns its name.
func (k *kubeEnv) runningPod(selector string, timeout time.Duration, not ...string) string {
	k.t.Helper()
	var name string
	eventually(k.t, timeout, "a new ready pod of "+selector, func() (bool, string) {
		l, err := k.cs.CoreV1().Pods(k.ns).List(k.ctx(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range l.Items {
			if slices.Contains(not, p.Name) || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					name = p.Name
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("pods %v", podNames(l))
	})
	return name
}

// waitGone waits until the pod no longer exists.
func (k *kubeEnv) waitGone(pod string, timeout time.Duration) {
	k.t.Helper()
	eventually(k.t, timeout, "pod "+pod+" to go", func() (bool, string) {
		p, err := k.cs.CoreV1().Pods(k.ns).Get(k.ctx(), pod, metav1.GetOptions{})
		if err != nil {
			return true, ""
		}
		return false, string(p.Status.Phase)
	})
}

// logsTo writes the logs of the pod's container, every attempt, to file
// (kcr standby's JSON log, for sbRun.countLogs). They are read from the
// kubelet's files: the API server cannot reach a kubelet on loopback.
func (k *kubeEnv) logsTo(pod, file string) {
	k.t.Helper()
	p, err := k.cs.CoreV1().Pods(k.ns).Get(k.ctx(), pod, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	logs, _ := filepath.Glob(filepath.Join("/var/log/pods", k.ns+"_"+pod+"_"+string(p.UID), "service", "*.log"))
	slices.SortFunc(logs, func(a, b string) int { return logAttempt(a) - logAttempt(b) })
	var out []byte
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			k.t.Fatal(err)
		}
		// Each line: time, stream, tag (F full, P partial), message.
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.SplitN(line, " ", 4); len(f) == 4 {
				out = append(out, f[3]...)
				if f[2] == "F" {
					out = append(out, '\n')
				}
			}
		}
	}
	if err := os.WriteFile(file, out, 0o600); err != nil {
		k.t.Fatal(err)
	}
}

// logAttempt is the container's attempt of a kubelet log file (N.log).
func logAttempt(file string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(file), ".log"))
	return n
}

// produceOrder produces one order (examples/loadgen's format).
func produceOrder(t *testing.T, k *kafkaEnv, orders, id string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v, _ := json.Marshal(map[string]any{"id": id, "n": 1, "ts": time.Now().UnixNano()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: orders, Key: []byte(id), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitResult waits until an independent reader sees a result of order id.
func waitResult(t *testing.T, k *kafkaEnv, results, id string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "the result of order "+id, func() (bool, string) {
		n := resultCounts(t, k, results)[id]
		return n > 0, fmt.Sprintf("%d results", n)
	})
}

// freePort is a TCP port free on loopback now.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// fitStandbyDeployment fits the shipped Deployment to the test's cluster:
// the test's image and service (args), and, since the cluster has no CNI
// and the broker is on loopback, the host network with kcr standby's
// metrics and probes on a free port of 127.0.0.1.
// Everything else is applied as it ships.
func fitStandbyDeployment(t *testing.T, image string, port int, args []string) func(*corev1.PersistentVolumeClaim, *appsv1.Deployment) {
	return func(_ *corev1.PersistentVolumeClaim, d *appsv1.Deployment) {
		s := &d.Spec.Template.Spec
		s.HostNetwork = true
		c := &s.Containers[0]
		c.Image, c.Args = image, args
		i := slices.Index(c.Command, "--metrics")
		if i < 0 || len(c.Ports) != 1 || c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Fatalf("%s: no --metrics, port and probes to fit", standbyDeploymentFile)
		}
		c.Command[i+1] = fmt.Sprintf("127.0.0.1:%d", port)
		c.Ports[0].ContainerPort = int32(port)
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			p.HTTPGet.Host, p.HTTPGet.Port = "127.0.0.1", intstr.FromInt32(int32(port))
		}
	}
}

// TestKubeStandbyDeployment: deploy/kubernetes/kcr-standby-deployment.yaml
// applied as it ships (server-side apply; the test's image, service and
// loopback address fitted in) to a control plane built from the module
// proxy, its claim bound to a hostPath volume: the pod runs kcr standby,
// and an order produced to Kafka is processed (a cold start). Then a
// rollout restart of the running service (the pod template's
// kubectl.kubernetes.io/restartedAt annotation, as kubectl rollout restart
// sets it): the old pod checkpoints on SIGTERM and the next pod answers
// the next order warm, restored from that image. Then an eviction through
// the Eviction API (what kubectl drain does) of the running service, and
// one of the sleeping service: warm on the next pod each time. Every
// order has exactly one result, read by an independent reader.
func TestKubeStandbyDeployment(t *testing.T) {
	c := newCRI(t)
	cluster := newKube(t)
	image := c.standbyImage()
	for _, client := range []string{"franz", "kafka-go"} {
		t.Run(client, func(t *testing.T) { kubeStandbyDeployment(t, cluster.namespace(t), c.dir, image, client) })
	}
}

// kubeStandbyDeployment is TestKubeStandbyDeployment's run in namespace
// ku.ns, the demo pipeline on client.
func kubeStandbyDeployment(t *testing.T, ku *kubeEnv, logDir, image, client string) {
	k := needKafka(t)
	orders, results := k.newTopic("kube-standby-orders", 2), k.newTopic("kube-standby-results", 2)
	group := uniqueName("kube-standby")
	args := []string{"--idle", "15s", "--brokers", k.brokers, "--group", group, "--topics", orders, "--",
		"/usr/local/bin/pipeline", "-brokers", k.brokers, "-group", group, "-in", orders, "-out", results,
		"-client", client, "-warmup", "1s", "-cache-mb", "16", "-stats-every", "0"}
	if client == "franz" {
		args = append(args, "-kgo-balancer", "server")
	}
	pvc, _ := readStandbyManifest(t)
	vol := ku.hostPathPV(pvc.Name, pvc.Spec.Resources.Requests[corev1.ResourceStorage])
	sb := &sbRun{t: t, k: k, dir: filepath.Join(vol, "img")}
	var ids []string
	order := func(n int) string {
		id := fmt.Sprintf("%s-%d", group, n)
		ids = append(ids, id)
		produceOrder(t, k, orders, id)
		return id
	}
	// checkWarm: the pod's kcr standby restored the service on Kafka lag,
	// never started it cold, from an image other than old (the one the
	// running service was restored from: the previous pod checkpointed it
	// on SIGTERM).
	checkWarm := func(pod, what, old string) {
		sb.errLog = filepath.Join(logDir, pod+".log")
		ku.logsTo(pod, sb.errLog)
		var from []string
		for _, m := range sb.logs() {
			if m["msg"] == "standby: resuming from an image" {
				from = append(from, fmt.Sprint(m["image"]))
			}
		}
		n, r := sb.countLogs("standby: starting"), sb.countLogs("standby: running", "source", "kafka")
		if n != 0 || r != 1 || len(from) != 1 || from[0] == old {
			b, _ := os.ReadFile(sb.errLog)
			t.Errorf("%s: the next pod %s started the service cold %d times, restored it %d times on Kafka lag, from images %q; want 0, 1, one image other than %q\n%s",
				what, pod, n, r, from, old, tailLines(string(b), 30))
		}
	}
	// restoredFrom is the image the running service was restored from ("" if
	// it was started cold).
	restoredFrom := func() string {
		st, err := sb.status()
		if err != nil || st.State != "running" {
			t.Fatalf("state %q (%v), want running", st.State, err)
		}
		return st.Image
	}

	ta := time.Now()
	ku.applyDeployment(fitStandbyDeployment(t, image, freePort(t), args))
	id := order(0)
	pod := ku.runningPod("app=orders", 3*time.Minute)
	waitResult(t, k, results, id, 3*time.Minute)
	t.Logf("kubectl apply → first result (cold start): %v", time.Since(ta).Round(time.Millisecond))

	// kubectl rollout restart of the running service.
	old := restoredFrom()
	tr := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := ku.cs.AppsV1().Deployments(ku.ns).Patch(ku.ctx(), "orders", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	next := ku.runningPod("app=orders", 3*time.Minute, pod)
	id = order(1)
	waitResult(t, k, results, id, 3*time.Minute)
	t.Logf("rollout restart → first result on the next pod: %v", time.Since(tr).Round(time.Millisecond))
	checkWarm(next, "rollout restart", old)
	pod = next

	// Evictions, of the running service and of the sleeping one.
	for _, asleep := range []bool{false, true} {
		what, old := "eviction of the sleeping service", ""
		if asleep {
			sb.waitState("standby", 2*time.Minute)
		} else {
			what, old = "eviction of the running service", restoredFrom()
		}
		te := time.Now()
		err := ku.cs.PolicyV1().Evictions(ku.ns).Evict(ku.ctx(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ku.ns}})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		next := ku.runningPod("app=orders", 3*time.Minute, pod)
		id = order(len(ids))
		waitResult(t, k, results, id, 3*time.Minute)
		restarts := int32(-1)
		if p, err := ku.cs.CoreV1().Pods(ku.ns).Get(ku.ctx(), next, metav1.GetOptions{}); err == nil && len(p.Status.ContainerStatuses) == 1 {
			restarts = p.Status.ContainerStatuses[0].RestartCount
		}
		t.Logf("%s → first result on the next pod: %v (its container restarted %d times)", what, time.Since(te).Round(time.Millisecond), restarts)
		ku.waitGone(pod, 2*time.Minute)
		checkWarm(next, what, old)
		pod = next
	}

	// Asleep, the service committed everything it took: no result can
	// come after this read.
	sb.waitState("standby", 2*time.Minute)
	counts := resultCounts(t, k, results)
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("order %s has %d results, want 1", id, counts[id])
		}
	}
	for id := range counts {
		if !slices.Contains(ids, id) {
			t.Errorf("a result for order %s, which was never sent", id)
		}
	}
	if err := ku.cs.AppsV1().Deployments(ku.ns).Delete(ku.ctx(), "orders", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ku.waitGone(pod, 2*time.Minute)
}

// readStandbyManifest decodes the shipped claim and Deployment.
func readStandbyManifest(t *testing.T) (*corev1.PersistentVolumeClaim, *appsv1.Deployment) {
	t.Helper()
	b, err := os.ReadFile(standbyDeploymentFile)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	var pvc corev1.PersistentVolumeClaim
	var dep appsv1.Deployment
	if len(docs) != 2 || yaml.UnmarshalStrict([]byte(docs[0]), &pvc) != nil || yaml.UnmarshalStrict([]byte(docs[1]), &dep) != nil {
		t.Fatalf("%s: not a PersistentVolumeClaim and a Deployment", standbyDeploymentFile)
	}
	return &pvc, &dep
}
