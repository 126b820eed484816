package container

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// startImage reads what the manifest records of the container's init pid
// and starts the image out, signed with key if not nil.
func startImage(pid int, out string, key ed25519.PrivateKey) (images.Process, *images.Builder, error) {
	proc, err := engine.ProcessInfo(pid)
	if err != nil {
		return proc, nil, err
	}
	b, err := engine.CreateImage(out, key)
	return proc, b, err
}

// bundleFix is the advice when a bundle's spec is refused.
const bundleFix = "kcr would sign (or export) a spec that user wrote: keep the bundle in a directory only root can write"

// CheckpointContainer checkpoints a runc container with "runc checkpoint"
// into a kcr image: runc's images in its criu/ directory, the manifest
// beside them. The app's hooks run in kcr's CRIU action script
// (kcr install-runtime-hook), whose reports go into the manifest.
func CheckpointContainer(ctx context.Context, o CheckpointOptions) (*engine.CheckpointResult, error) {
	start := time.Now()
	if o.TCPClose {
		// runc has no tcp-close flag (its --tcp-established is the
		// opposite: dump connections in repair mode); CRIU reads
		// tcp-close only from runc's CRIU configuration.
		return nil, errors.New("--tcp-close with --container: runc takes tcp-close only from its CRIU configuration; run kcr install-runtime-hook --tcp-close instead")
	}
	if o.isPodman() {
		return checkpointPodman(ctx, o)
	}
	st, err := o.State(ctx)
	if err != nil {
		if o.podmanKnows(ctx) {
			return checkpointPodman(ctx, o)
		}
		return nil, err
	}
	if st.Status != "running" {
		return nil, fmt.Errorf("container %s is %s: %w: only a running container can be checkpointed", o.ID, st.Status, ErrContainerState)
	}
	hasSock := hasKCRSocket(st.PID)
	if hasSock {
		if err := needHook(o.ID, st); err != nil {
			return nil, err
		}
	}
	// The spec is signed with the image: as root, only from a bundle no
	// other user can write. Read before the dump: once the container
	// exits, its manager (containerd's shim) may delete the bundle.
	spec, err := images.ReadTrustedFile(filepath.Join(st.Bundle, "config.json"), images.MaxManifestSize, bundleFix)
	if err != nil {
		return nil, fmt.Errorf("container %s: bundle: %w", o.ID, err)
	}
	proc, b, err := startImage(st.PID, o.Output, o.SignKey)
	if err != nil {
		return nil, err
	}
	defer b.Abort() // removes the unfinished image; a no-op once committed
	if err := os.MkdirAll(b.CRIUDir(), 0o700); err != nil {
		return nil, err
	}
	res := &engine.CheckpointResult{Image: b.Final()}
	args := []string{"checkpoint", "--image-path", b.CRIUDir(), "--work-path", b.CRIUDir()}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	if o.RequireDrained {
		o.env = append(o.env, criuaction.EnvRequireDrained+"=1")
	}
	t := time.Now()
	_, err = o.runc(ctx, nil, append(args, o.ID)...)
	res.Timings.Add(PhaseRuncCheckpoint, time.Since(t))
	if err != nil {
		dumpLog := filepath.Join(b.CRIUDir(), "dump.log")
		if he := proto.CarryMarker.Failure(readLog(dumpLog), "container "+o.ID); he != nil {
			return nil, he
		}
		if he := failedHooks(filepath.Join(b.CRIUDir(), criuaction.ReportsFile)); he != nil {
			return nil, he
		}
		// The unfinished image, with CRIU's log, is removed: keep its last error.
		return nil, fmt.Errorf("container %s: %w (CRIU: %s)", o.ID, err, logTail(filepath.Join(b.CRIUDir(), "dump.log"), "Error"))
	}

	if err := b.WriteFile(containerSpecFile, spec); err != nil {
		return nil, err
	}
	reports, _ := os.ReadFile(filepath.Join(b.CRIUDir(), criuaction.ReportsFile))
	if err := commitContainer(ctx, b, res, proc, hasSock, reports, o, containerRecord{ID: o.ID, Bundle: st.Bundle}); err != nil {
		return nil, err
	}
	res.Timings.Add(engine.PhaseTotal, time.Since(start))
	return res, nil
}

// commitContainer writes the manifest of a container image, with the
// hooks' reports that kcr's action script left (reports, may be nil), and
// commits it.
func commitContainer(ctx context.Context, b *images.Builder, res *engine.CheckpointResult, proc images.Process, hasSock bool, reports []byte, o CheckpointOptions, rec containerRecord) error {
	m := &images.Manifest{KCRVersion: engine.Version, Kernel: engine.Kernel(), Host: engine.Hostname(), Process: proc, NoHooks: !hasSock,
		Options: images.Options{LeaveRunning: o.LeaveRunning, TCPClose: o.TCPClose}}
	if _, v, err := engine.CRIU(ctx, ""); err == nil {
		m.CRIUVersion = v.String()
	}
	var hr struct {
		Targets []struct {
			Socket  string             `json:"socket"`
			Reports []proto.HookReport `json:"reports"`
		} `json:"targets"`
	}
	if reports != nil && json.Unmarshal(reports, &hr) == nil {
		var slowest time.Duration // the apps quiesce at once
		for _, tg := range hr.Targets {
			if m.ControlSocket == "" {
				m.ControlSocket = tg.Socket
			}
			var d time.Duration
			for _, r := range tg.Reports {
				d += time.Duration(r.Duration)
			}
			engine.AddResources(m, tg.Reports)
			slowest = max(slowest, d)
		}
		if len(hr.Targets) > 0 {
			res.Timings = append(engine.Timings{{Name: engine.PhaseHooks, DurationNS: int64(slowest)}}, res.Timings...)
		}
	} else if hasSock {
		res.Warnings = append(res.Warnings, "the hook's reports ("+criuaction.ReportsFile+") are missing: see CRIU's dump.log")
	}
	cb, _ := json.Marshal(rec)
	if err := b.WriteFile(containerBundleFile, cb); err != nil {
		return err
	}
	// kcr's action-script watcher writes to CRIU's log as it resumes a
	// --leave-running app, which may be after runc has returned.
	if err := b.Detach(images.CRIUSubdir + "/dump.log"); err != nil {
		return err
	}
	t := time.Now()
	m.Phases = append(m.Phases, res.Timings...)
	img, err := b.Commit(context.WithoutCancel(ctx), m)
	if err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	res.Timings.Add(engine.PhaseImageWrite, time.Since(t))
	res.Manifest = img.Manifest
	return nil
}

// failedHooks returns the HookFailure that kcr's action script recorded
// in its reports file when before-checkpoint hooks failed, or nil if none
// did (or there are no reports).
func failedHooks(reportsFile string) *proto.HookFailure {
	b, err := os.ReadFile(reportsFile)
	if err != nil {
		return nil
	}
	var res criuaction.Result
	if json.Unmarshal(b, &res) != nil {
		return nil
	}
	return criuaction.Failure(res.Targets)
}

// readLog returns the text of CRIU's log at path, or "" if it is unreadable.
func readLog(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// logTail returns the last line of a log that contains marker.
func logTail(path, marker string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var last string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, marker) {
			last = strings.TrimSpace(l)
		}
	}
	return last
}
