package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kcr-dev/kcr/criuaction"
)

// criImage is the image of the CRI tests, and containerd-up.sh's sandbox
// ("pause") image: no registry is reachable, so the test imports it.
const criImage = "kcr.local/e2e:1"

// criEnv speaks CRI to the containerd of scripts/containerd-up.sh, as the
// kubelet does.
type criEnv struct {
	t    *testing.T
	rt   cri.RuntimeServiceClient
	img  cri.ImageServiceClient
	dir  string
	conf string // CRIU configuration that runs kcr's hook (org.criu.config)
}

func newCRI(t *testing.T) *criEnv {
	t.Helper()
	sock := os.Getenv("KCR_CONTAINERD_SOCK")
	if sock == "" {
		sock = "/run/kcr-containerd/containerd.sock"
	}
	if _, err := os.Stat(sock); err != nil {
		skipOrFail(t, "no containerd at %s (scripts/install-containerd.sh, then scripts/containerd-up.sh)", sock)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &criEnv{t: t, rt: cri.NewRuntimeServiceClient(conn), img: cri.NewImageServiceClient(conn), dir: t.TempDir()}
	v, err := c.rt.Version(c.ctx(), &cri.VersionRequest{})
	if err != nil {
		t.Fatalf("CRI Version on %s: %v", sock, err)
	}
	t.Logf("CRI runtime %s %s (CRI %s)", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	c.conf = filepath.Join(c.dir, "criu.conf")
	runKCR(t, kcrOpts{must: true}, "install-runtime-hook", "--config", c.conf, "--hook", filepath.Join(c.dir, "kcr-criu-hook"))
	c.importImage(sock)
	return c
}

func (c *criEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c.t.Cleanup(cancel)
	return ctx
}

// buildImage builds the tests' image (kafkaapp and pause, entrypoint
// /pause) with go-containerregistry; labels make its ID differ.
func (c *criEnv) buildImage(labels map[string]string) v1.Image {
	t := c.t
	img, err := mutate.AppendLayers(empty.Image, imageLayer(t))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Entrypoint: []string{"/pause"}, Labels: labels}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// importImage imports the image as criImage, the sandbox image, with ctr
// into the CRI namespace.
func (c *criEnv) importImage(sock string) {
	t := c.t
	ref, err := name.ParseReference(criImage)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.dir, "image.tar")
	if err := tarball.WriteToFile(file, ref, c.buildImage(nil)); err != nil {
		t.Fatal(err)
	}
	ctr := "/opt/kcr/containerd/bin/ctr"
	if p := os.Getenv("KCR_CONTAINERD_PREFIX"); p != "" {
		ctr = filepath.Join(p, "bin", "ctr")
	}
	if out, err := exec.Command(ctr, "--address", sock, "-n", "k8s.io", "images", "import", file).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v: %s", err, out)
	}
	// The CRI plugin learns of the import from an event.
	eventually(t, 10*time.Second, "the CRI image service to list "+criImage, func() (bool, string) {
		st, err := c.img.ImageStatus(c.ctx(), &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: criImage}})
		return err == nil && st.Image != nil, fmt.Sprintf("ImageStatus: %v", err)
	})
}

// registryImage serves the image from a registry on loopback (in this
// process) and pulls it with CRI PullImage, as the kubelet does. A
// container restored from a checkpoint needs this: containerd 2.1 pulls
// the checkpoint's base image by NAME@DIGEST, even when it holds it.
func (c *criEnv) registryImage() string {
	t := c.t
	ref, err := name.ParseReference(c.serveRegistry() + "/kcr-e2e:1")
	if err != nil {
		t.Fatal(err)
	}
	// An image of its own: one with the ID of an earlier run's would carry
	// that run's registry (gone) among its repo digests, and the checkpoint
	// may name that one.
	if err := remote.Write(ref, c.buildImage(map[string]string{"kcr.e2e.run": uniqueName("run")})); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	r, err := c.img.PullImage(c.ctx(), &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref.String()}})
	if err != nil {
		t.Fatalf("CRI PullImage %s: %v", ref, err)
	}
	t.Logf("CRI PullImage %s: %s", ref, r.ImageRef)
	t.Cleanup(func() {
		c.img.RemoveImage(context.Background(), &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: r.ImageRef}})
	})
	return ref.String()
}

// serveRegistry serves a registry on loopback (in this process) until the
// test ends and returns its host:port.
func (c *criEnv) serveRegistry() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	c.t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// pod runs a pod sandbox on the host network (the broker is on loopback).
func (c *criEnv) pod(name string) (string, *cri.PodSandboxConfig) {
	c.t.Helper()
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Uid: uniqueName("uid"), Namespace: "kcr-e2e"},
		LogDirectory: filepath.Join(c.dir, name),
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE}}},
	}
	r, err := c.rt.RunPodSandbox(c.ctx(), &cri.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		c.t.Fatalf("CRI RunPodSandbox %s: %v", name, err)
	}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: r.PodSandboxId})
		c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: r.PodSandboxId})
	})
	return r.PodSandboxId, cfg
}

// container creates and starts a container from image (criImage, or a
// checkpoint archive to restore) in the pod, with kafkaapp's args.
func (c *criEnv) container(podID string, podCfg *cri.PodSandboxConfig, image string, args []string) string {
	c.t.Helper()
	cfg := &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "kafkaapp"},
		Image:    &cri.ImageSpec{Image: image},
		Command:  []string{"/kafkaapp"},
		Args:     args,
		Envs:     []*cri.KeyValue{{Key: "GODEBUG", Value: []byte("multipathtcp=0")}},
		// Passed to runc (containerd-up.sh's container_annotations).
		// The container has its own PID namespace, as the kubelet gives it
		// unless the pod shares one: restoring into a shared one needs the
		// checkpointed PID free there, which it may not be (CRIU: "type
		// NOTIFY errno 17").
		Annotations: map[string]string{"org.criu.config": c.conf},
		LogPath:     "kafkaapp.log",
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER}}},
	}
	r, err := c.rt.CreateContainer(c.ctx(), &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		c.t.Fatalf("CRI CreateContainer from %s: %v", image, err)
	}
	if _, err := c.rt.StartContainer(c.ctx(), &cri.StartContainerRequest{ContainerId: r.ContainerId}); err != nil {
		c.t.Fatalf("CRI StartContainer %s: %v%s", r.ContainerId, err, criuLogOf(err))
	}
	return r.ContainerId
}

// follow turns the CRI log file (each line "time stream tag message")
// into kafkaapp's JSON lines in dst, until the test ends.
func (c *criEnv) follow(src, dst string) {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	c.t.Cleanup(func() { close(done); <-stopped; out.Close() })
	go func() {
		defer close(stopped)
		var off int64
		var partial []byte
		for {
			if b, err := os.ReadFile(src); err == nil && int64(len(b)) > off {
				chunk := b[off:]
				if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
					chunk = chunk[:i+1]
					off += int64(len(chunk))
					sc := bufio.NewScanner(bytes.NewReader(chunk))
					sc.Buffer(nil, 16<<20)
					for sc.Scan() {
						f := strings.SplitN(sc.Text(), " ", 4)
						if len(f) < 4 {
							continue
						}
						partial = append(partial, f[3]...)
						if f[2] == "F" {
							out.Write(append(partial, '\n'))
							partial = partial[:0]
						}
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
}

func (c *criEnv) stop(id string) {
	c.t.Helper()
	if _, err := c.rt.StopContainer(c.ctx(), &cri.StopContainerRequest{ContainerId: id, Timeout: 30}); err != nil {
		c.t.Fatalf("CRI StopContainer %s: %v", id, err)
	}
}

// startService runs kafkaapp as a service (serviceArgs) in a new pod from
// image, and waits until it serves in its group. It returns the
// container's id, the app and its state.
func (c *criEnv) startService(k *kafkaEnv, image, topic, group, base string) (string, *kapp, appState) {
	t := c.t
	t.Helper()
	podID, podCfg := c.pod(uniqueName("cri-pod"))
	ctrID := c.container(podID, podCfg, image, serviceArgs(k, topic, group, base))
	a := &kapp{app: &app{t: t, out: filepath.Join(c.dir, "app.log"), done: make(chan struct{})}, k: k}
	k.keepLog(a)
	c.follow(filepath.Join(podCfg.LogDirectory, "kafkaapp.log"), a.out)
	ev := a.waitEvent(30*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		t.Fatalf("kafkaapp failed to start in the CRI container: %v", ev)
	}
	a.listen = ev.str("listen")
	return ctrID, a, k.waitServing(a, topic, group, base)
}

// restoreService creates and starts a container from image (a checkpoint)
// in a new pod, follows its log into a's, and checks that a new instance
// serves and that no acked record is missing once it stops. It returns the
// new pod's id.
func (c *criEnv) restoreService(k *kafkaEnv, a *kapp, image string, before appState, topic, group, base string) string {
	t := c.t
	t.Helper()
	n1 := len(a.events())
	pod2, pod2Cfg := c.pod(uniqueName("cri-pod-restored"))
	t0 := time.Now()
	c.container(pod2, pod2Cfg, image, nil)
	t.Logf("CRI CreateContainer+StartContainer from %s took %v", image, time.Since(t0).Round(time.Millisecond))
	a.followInto(filepath.Join(c.dir, "copy.log"))
	c.follow(filepath.Join(pod2Cfg.LogDirectory, "kafkaapp.log"), a.out)
	checkNewInstance(t, a, n1, before, base, group, topic)
	a.waitProcessed(n1, 50, 30*time.Second)
	ackedBefore := len(acked(a.events()))
	a.waitAcked(ackedBefore+100, 30*time.Second)

	ids, err := c.rt.ListContainers(c.ctx(), &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: pod2}})
	if err != nil || len(ids.Containers) != 1 {
		t.Fatalf("CRI ListContainers in the restored pod: %v, %v", ids, err)
	}
	n := len(a.events())
	c.stop(ids.Containers[0].Id)
	a.waitExit(n)
	k.checkAcked(topic, acked(a.events()))
	return pod2
}

// criRuncRoot is runc's state directory of the containers of containerd's
// CRI namespace (the runc shim's default root).
const criRuncRoot = "/run/containerd/runc/k8s.io"

// TestCRIContainerdOCIImage: a pod restores from the OCI checkpoint image
// that "kcr export --format oci" writes of "kcr checkpoint --container" of
// a CRI container, pushed to a registry with go-containerregistry and
// pulled with CRI PullImage, as the kubelet pulls a pod's image: containerd
// recognises it (org.criu.checkpoint.container.name), reads its
// status.dump and config.dump, restores the copy onto the base image, and
// the copy serves as a new instance; no acked record is missing.
func TestCRIContainerdOCIImage(t *testing.T) {
	c := newCRI(t)
	k := needKafka(t)
	topic, group, base := k.newTopic("kcr-cri-oci", 1), uniqueName("cri-oci-group"), "cri-oci"
	image := c.registryImage()
	ctrID, a, before := c.startService(k, image, topic, group, base)

	img := filepath.Join(c.dir, "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--container", ctrID, "--runc-root", criRuncRoot, "-o", img)
	layoutDir := filepath.Join(c.dir, "oci")
	r := runKCR(t, kcrOpts{must: true}, "export", "--format", "oci", "-o", layoutDir, img)
	if strings.Contains(r.stderr, "--base-image") {
		t.Errorf("kcr export of a CRI container warns of no base image: its spec names it\n%s", r.stderr)
	}
	ref := pushLayout(t, layoutDir, strings.Split(image, "/")[0]+"/kcr-e2e-checkpoint:1")
	pulled, err := c.img.PullImage(c.ctx(), &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("CRI PullImage %s: %v", ref, err)
	}
	t.Cleanup(func() {
		c.img.RemoveImage(context.Background(), &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: pulled.ImageRef}})
	})
	c.restoreService(k, a, ref, before, topic, group, base)
}

// pushLayout pushes the one image of an OCI layout to ref, a registry on
// loopback, and returns ref.
func pushLayout(t *testing.T, dir, ref string) string {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("OCI layout %s: %v images (%v), want one", dir, im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// TestCRIContainerd: the kubelet's checkpoint API and a restore, as CRI
// calls to containerd 2: RunPodSandbox, CreateContainer and StartContainer
// with the hooked service, CheckpointContainer to an archive (what POST
// /checkpoint/{ns}/{pod}/{ctr} does; the container keeps running, so its
// hooks end with a resume of the same instance), then CreateContainer from
// the archive in a new sandbox and StartContainer: the copy runs its
// after-restore hooks as a new instance with new client ids in the group,
// and an independent reader finds every acknowledged record.
func TestCRIContainerd(t *testing.T) {
	c := newCRI(t)
	k := needKafka(t)
	topic, group, base := k.newTopic("kcr-cri", 1), uniqueName("cri-group"), "cri"

	ctrID, a, before := c.startService(k, c.registryImage(), topic, group, base)

	archive := filepath.Join(c.dir, "checkpoint.tar")
	n0 := len(a.events())
	t0 := time.Now()
	if _, err := c.rt.CheckpointContainer(c.ctx(), &cri.CheckpointContainerRequest{ContainerId: ctrID, Location: archive, Timeout: 60}); err != nil {
		t.Fatalf("CRI CheckpointContainer: %v%s", err, criuLogOf(err))
	}
	t.Logf("CRI CheckpointContainer took %v", time.Since(t0).Round(time.Millisecond))
	checkHookReports(t, tarMember(t, archive, "checkpoint/"+criuaction.ReportsFile), topic, group)
	if !toldLeaveRunning(t, a.since(n0)) {
		t.Error("CRI CheckpointContainer leaves the container running, but its before-checkpoint hooks saw notify.LeaveRunning false")
	}
	// The kubelet's checkpoint leaves the container running: the same
	// instance resumes, under its old client id.
	resumed := a.waitAfter(n0, 30*time.Second)
	if resumed.str("kind") != "resume" || resumed.str("instance") != before.Instance || resumed.str("writer_client") != base {
		t.Errorf("after the checkpoint the original ran its hooks as %v: want kind resume, instance %s, client id %s", resumed, before.Instance, base)
	}
	// Migrate: the original stops (it flushes and leaves), the copy starts.
	n := len(a.events())
	t0 = time.Now()
	c.stop(ctrID)
	a.waitExit(n)
	k.waitLeft(group, topic, time.Since(t0))

	pod2 := c.restoreService(k, a, archive, before, topic, group, base)

	// Pod-level checkpoint (KEP-5823) is not in containerd 2.1.
	_, err := c.rt.CheckpointPod(c.ctx(), &cri.CheckpointPodRequest{PodSandboxId: pod2, OutputPath: filepath.Join(c.dir, "pod.tar")})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("CRI CheckpointPod: %v; containerd 2.1 has no pod checkpoint (want Unimplemented): cover it now", err)
	}
}

// criuLogOf returns the kcr and error lines of the CRIU log that a failed
// checkpoint names, while the task's directory still holds it.
func criuLogOf(err error) string {
	var p string
	for _, m := range []string{"path= ", "log file: "} {
		if i := strings.Index(err.Error(), m); i >= 0 {
			p = strings.Fields(err.Error()[i+len(m):])[0]
		}
	}
	if p == "" {
		return ""
	}
	b, rerr := os.ReadFile(p)
	if rerr != nil {
		return "\n(" + rerr.Error() + ")"
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error") || strings.Contains(l, "kcr") || strings.Contains(l, "script") {
			keep = append(keep, l)
		}
	}
	return "\n" + p + ":\n" + strings.Join(keep, "\n")
}
