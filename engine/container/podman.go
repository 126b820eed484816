package container

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// PodmanArchive, in a kcr image of a Podman container, is Podman's own
// checkpoint archive (podman container checkpoint --export, uncompressed),
// which podman container restore --import reads back.
const PodmanArchive = "podman-checkpoint.tar"

// Phase names of Podman checkpoints and restores.
const (
	PhasePodmanCheckpoint = "podman checkpoint"
	PhasePodmanRestore    = "podman restore"
)

// podmanInspect is the part of "podman container inspect" kcr reads.
type podmanInspect struct {
	ID    string `json:"Id"`
	Name  string `json:"Name"`
	State struct {
		Status string `json:"Status"`
		Pid    int    `json:"Pid"`
	} `json:"State"`
	OCIRuntime string `json:"OCIRuntime"`
	Config     struct {
		Annotations map[string]string `json:"Annotations"`
	} `json:"Config"`
}

// isPodman says whether o drives Podman rather than runc.
func (o *Target) isPodman() bool { return filepath.Base(o.Runtime) == "podman" }

// podmanKnows says whether podman is installed and has the container: a
// container runc does not know is looked for there.
func (o *Target) podmanKnows(ctx context.Context) bool {
	if o.Runtime != "" && o.Runtime != "runc" {
		return false
	}
	p, err := exec.LookPath("podman")
	return err == nil && exec.CommandContext(ctx, p, "container", "exists", o.ID).Run() == nil
}

// podman runs a podman command and returns its stdout; errors carry its
// stderr.
func (o *Target) podman(ctx context.Context, args ...string) (string, error) {
	bin := o.Runtime
	if !o.isPodman() {
		bin = "podman"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	if o.env != nil {
		cmd.Env = append(os.Environ(), o.env...)
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// podman restore starts the container under conmon, which keeps no
	// stdio of kcr's.
	cmd.Stdin = nil
	err := cmd.Run()
	if errors.Is(err, exec.ErrNotFound) {
		return "", fmt.Errorf("%s not found: install podman, or name it with --runtime", bin)
	}
	if err != nil {
		return stdout.String(), fmt.Errorf("podman %s: %w: %w: %s", args[1], ErrRuntimeFailed, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (o *Target) podmanInspect(ctx context.Context) (*podmanInspect, error) {
	out, err := o.podman(ctx, "container", "inspect", o.ID)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w: %w", o.ID, ErrContainerState, err)
	}
	var in []podmanInspect
	if err := json.Unmarshal([]byte(out), &in); err != nil || len(in) != 1 {
		return nil, fmt.Errorf("podman container inspect %s: unreadable output (%v)", o.ID, err)
	}
	return &in[0], nil
}

// checkpointPodman checkpoints a Podman container with "podman container
// checkpoint --export" into a kcr image: Podman's archive (PodmanArchive)
// with the manifest beside it. The hooks run in kcr's CRIU action script,
// so Podman's OCI runtime must be runc, configured by kcr
// install-runtime-hook. crun 1.28 with CRIU 4.2's libcriu reads the
// org.criu.config annotation too and runs the hook at the dump, but its
// restore under Podman 5.8 killed every process of its PID namespace here
// (docs/runtimes.md), so kcr still refuses crun.
func checkpointPodman(ctx context.Context, o CheckpointOptions) (*engine.CheckpointResult, error) {
	start := time.Now()
	in, err := o.podmanInspect(ctx)
	if err != nil {
		return nil, err
	}
	if in.State.Status != "running" {
		return nil, fmt.Errorf("container %s is %s: %w: only a running container can be checkpointed", o.ID, in.State.Status, ErrContainerState)
	}
	hasSock := hasKCRSocket(in.State.Pid)
	if hasSock {
		if rt := filepath.Base(in.OCIRuntime); rt != "runc" {
			return nil, fmt.Errorf("container %s has a kcr control socket, but podman runs it with %s, which kcr does not support (crun: see docs/runtimes.md): %w; start it with podman --runtime runc", o.ID, rt, ErrNoRuntimeHook)
		}
		if err := needHook(o.ID, &ContainerState{Annotations: in.Config.Annotations}); err != nil {
			return nil, err
		}
	}
	proc, b, err := startImage(in.State.Pid, o.Output, o.SignKey)
	if err != nil {
		return nil, err
	}
	defer b.Abort() // removes the unfinished image; a no-op once committed
	res := &engine.CheckpointResult{Image: b.Final()}
	archive := filepath.Join(b.Dir(), PodmanArchive)
	args := []string{"container", "checkpoint", "--export", archive, "--compress", "none"}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	t := time.Now()
	_, err = o.podman(ctx, append(args, o.ID)...)
	res.Timings.Add(PhasePodmanCheckpoint, time.Since(t))
	if err != nil {
		// Podman keeps CRIU's log after a failure and names it.
		if log := podmanLog(err.Error()); log != "" {
			if he := failedHooks(filepath.Join(filepath.Dir(log), criuaction.ReportsFile)); he != nil {
				return nil, he
			}
			if he := proto.FailedMarker.Failure(readLog(log), ""); he != nil {
				return nil, he
			}
			return nil, fmt.Errorf("container %s: %w (CRIU: %s)", o.ID, err, logTail(log, "Error"))
		}
		if proto.FailedMarker.In(err.Error()) {
			return nil, &proto.HookFailure{Msg: err.Error()}
		}
		return nil, fmt.Errorf("container %s: %w", o.ID, err)
	}
	reports, err := archiveMember(archive, "checkpoint/"+criuaction.ReportsFile)
	if err != nil {
		return nil, fmt.Errorf("container %s: %s: %w", o.ID, PodmanArchive, err)
	}
	if err := commitContainer(ctx, b, res, proc, hasSock, reports, o, containerRecord{ID: in.Name, Runtime: "podman"}); err != nil {
		return nil, err
	}
	res.Timings.Add(engine.PhaseTotal, time.Since(start))
	return res, nil
}

var podmanLogRe = regexp.MustCompile(`(/\S+/dump\.log)`)

// podmanLog finds the CRIU log that a failed podman checkpoint names.
func podmanLog(msg string) string {
	m := podmanLogRe.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	return m[1]
}

// archiveMember returns the content of one small member of an uncompressed
// tar, or nil if it has none.
func archiveMember(file, name string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if filepath.Clean(h.Name) == name && h.Typeflag == tar.TypeReg {
			return io.ReadAll(io.LimitReader(tr, images.MaxManifestSize))
		}
	}
}

// restorePodman restores a verified kcr image of a Podman container with
// "podman container restore --import", as a container named o.ID (default:
// the checkpointed name). The restore is counted in the image and passed to
// kcr's action script, as for runc.
func restorePodman(ctx context.Context, o RestoreOptions, img *images.Image, rec containerRecord) (*ContainerRestoreResult, error) {
	start := time.Now()
	res := &ContainerRestoreResult{ID: o.ID}
	gen, err := images.NextGeneration(img.Dir)
	if err != nil {
		return nil, err
	}
	res.Generation = gen
	o.env = []string{criuaction.GenerationEnv + "=" + strconv.FormatUint(gen, 10)}
	args := []string{"container", "restore", "--import", filepath.Join(img.Dir, PodmanArchive)}
	if o.ID != "" && o.ID != rec.ID {
		args = append(args, "--name", o.ID)
	}
	t := time.Now()
	out, err := o.podman(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", rec.ID, err)
	}
	res.Timings.Add(PhasePodmanRestore, time.Since(t))
	if id := strings.TrimSpace(out); id != "" {
		o.ID = strings.Fields(id)[0]
	} else if o.ID == "" {
		o.ID = rec.ID
	}
	in, err := o.podmanInspect(ctx)
	if err != nil {
		return nil, err
	}
	res.ID, res.PID = in.Name, in.State.Pid
	res.Timings.Add(engine.PhaseTotal, time.Since(start))
	return res, nil
}
