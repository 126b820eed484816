// Command cribench times CRI CheckpointContainer (the kubelet's checkpoint
// API) on containerd for scripts/bench-runtimes.sh: one pod per CRIU
// configuration given (-conf NAME=FILE, the container's org.criu.config),
// each running kafkaapp with args, checkpointed in alternating rounds. It
// prints one line per checkpoint: "NAME MICROSECONDS HOOKS_MICROSECONDS",
// the last the sum of the hooks' run times in the archive's kcr-hooks.json.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type confs []string

func (c *confs) String() string     { return strings.Join(*c, ",") }
func (c *confs) Set(s string) error { *c = append(*c, s); return nil }

func main() {
	sock := flag.String("sock", "/run/kcr-containerd/containerd.sock", "containerd's socket")
	ctr := flag.String("ctr", "/opt/kcr/containerd/bin/ctr", "ctr, to import the image")
	image := flag.String("image", "kcr.local/e2e:1", "image name (containerd-up.sh's sandbox image)")
	app := flag.String("kafkaapp", "", "static kafkaapp")
	pause := flag.String("pause", "", "static pause")
	work := flag.String("work", os.TempDir(), "directory for logs and checkpoints")
	rounds := flag.Int("rounds", 10, "checkpoints per configuration")
	var cs confs
	flag.Var(&cs, "conf", "NAME=CRIU configuration file (repeatable)")
	flag.Parse()
	if err := run(*sock, *ctr, *image, *app, *pause, *work, *rounds, cs, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "cribench:", err)
		os.Exit(1)
	}
}

func run(sock, ctr, image, app, pause, work string, rounds int, cs confs, args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := importImage(ctx, sock, ctr, image, app, pause, work); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := cri.NewRuntimeServiceClient(conn)
	type ctrInfo struct{ name, pod, id string }
	var ctrs []ctrInfo
	defer func() {
		for _, c := range ctrs {
			rt.StopPodSandbox(context.Background(), &cri.StopPodSandboxRequest{PodSandboxId: c.pod})
			rt.RemovePodSandbox(context.Background(), &cri.RemovePodSandboxRequest{PodSandboxId: c.pod})
		}
	}()
	host := &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER} // the kubelet's default PID namespace
	for _, nc := range cs {
		n, conf, ok := strings.Cut(nc, "=")
		if !ok {
			return fmt.Errorf("-conf %q: want NAME=FILE", nc)
		}
		pc := &cri.PodSandboxConfig{
			Metadata:     &cri.PodSandboxMetadata{Name: "bench-" + n, Uid: fmt.Sprintf("bench-%s-%d", n, time.Now().UnixNano()), Namespace: "kcr-bench"},
			LogDirectory: filepath.Join(work, "logs-"+n),
			Linux:        &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: host}},
		}
		p, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pc})
		if err != nil {
			return fmt.Errorf("RunPodSandbox: %w", err)
		}
		ctrs = append(ctrs, ctrInfo{name: n, pod: p.PodSandboxId})
		c, err := rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.PodSandboxId, SandboxConfig: pc, Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: "kafkaapp"}, Image: &cri.ImageSpec{Image: image},
			Command: []string{"/kafkaapp"}, Args: args, LogPath: "kafkaapp.log",
			Envs:        []*cri.KeyValue{{Key: "GODEBUG", Value: []byte("multipathtcp=0")}},
			Annotations: map[string]string{"org.criu.config": conf},
			Linux:       &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{NamespaceOptions: host}},
		}})
		if err != nil {
			return fmt.Errorf("CreateContainer: %w", err)
		}
		if _, err := rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			return fmt.Errorf("StartContainer: %w", err)
		}
		ctrs[len(ctrs)-1].id = c.ContainerId
	}
	time.Sleep(2 * time.Second) // let the services connect and produce
	for i := 0; i < rounds; i++ {
		for _, c := range ctrs {
			loc := filepath.Join(work, fmt.Sprintf("%s-%d.tar", c.name, i))
			t0 := time.Now()
			if _, err := rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: c.id, Location: loc, Timeout: 60}); err != nil {
				return fmt.Errorf("CheckpointContainer %s: %w", c.name, err)
			}
			took := time.Since(t0)
			fmt.Printf("%s %d %d\n", c.name, took.Microseconds(), hooksUS(loc))
			os.Remove(loc)
			time.Sleep(500 * time.Millisecond)
		}
	}
	return nil
}

// hooksUS sums the hooks' run times in the archive's kcr-hooks.json (0
// without one), in µs.
func hooksUS(archive string) int64 {
	f, err := os.Open(archive)
	if err != nil {
		return 0
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return 0
		}
		if filepath.Clean(h.Name) != "checkpoint/kcr-hooks.json" {
			continue
		}
		var res struct {
			Targets []struct {
				Reports []struct {
					Duration int64 `json:"duration_ns"`
				} `json:"reports"`
			} `json:"targets"`
		}
		if json.NewDecoder(tr).Decode(&res) != nil {
			return 0
		}
		var ns int64
		for _, t := range res.Targets {
			for _, r := range t.Reports {
				ns += r.Duration
			}
		}
		return ns / 1000
	}
}

// importImage builds an image of kafkaapp and pause (entrypoint /pause)
// and imports it with ctr into the CRI namespace: no registry here.
func importImage(ctx context.Context, sock, ctr, image, app, pause, work string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for n, src := range map[string]string{"kafkaapp": app, "pause": pause} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	tw.Close()
	layer, err := tarball.LayerFromReader(&buf)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Entrypoint: []string{"/pause"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return err
	}
	file := filepath.Join(work, "image.tar")
	if err := tarball.WriteToFile(file, ref, img); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, ctr, "--address", sock, "-n", "k8s.io", "images", "import", file).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import: %w: %s", err, out)
	}
	time.Sleep(time.Second) // the CRI plugin learns of the import from an event
	return nil
}
