package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
	"github.com/kcr-dev/kcr/runtimehook"
)

// HookReportsFile is what kcr's CRIU action script writes beside CRIU's
// images at pre-dump: the hooks' reports, for the manifest of a container
// checkpoint.
const HookReportsFile = runtimehook.ReportsFile

// Phase names of container checkpoints and restores.
const (
	PhaseRuncCheckpoint = "runc checkpoint"
	PhaseRuncRestore    = "runc restore"
)

// ErrNoRuntimeHook is returned when a container with a kcr control socket
// would be checkpointed by a runc whose CRIU does not run kcr's hook.
var ErrNoRuntimeHook = errors.New("CRIU does not run kcr's hook for this container")

// ErrRuntimeFailed wraps a failed runc checkpoint or restore.
var ErrRuntimeFailed = errors.New("runtime failed")

// ErrContainerState is returned for a container that does not exist or is
// not running.
var ErrContainerState = errors.New("container not checkpointable")

// ContainerOptions configures CheckpointContainer and RestoreContainer.
type ContainerOptions struct {
	ID       string // the container's id
	Runtime  string // runc binary (default "runc" from PATH)
	RuncRoot string // runc --root (default: runc's)
	Output   string // CheckpointContainer: image directory to create
	Image    string // RestoreContainer: the kcr image
	Bundle   string // RestoreContainer: the bundle (default: the one recorded at checkpoint)
	// Stdout receives the restored container's stdout and stderr (runc
	// hands its own to the container); default /dev/null. kcr's own
	// stdio is never given to the container, so kcr can exit. The file is
	// truncated: the restored container writes it from its start.
	Stdout       string
	LeaveRunning bool
	TCPClose     bool
	// SignKey signs the image's manifest (CheckpointContainer).
	SignKey ed25519.PrivateKey
	// VerifyKeys and AllowUntrusted are as in RestoreOptions
	// (RestoreContainer); AllowUntrusted covers archives and OCI layouts
	// too.
	VerifyKeys     []ed25519.PublicKey
	AllowUntrusted bool
	// RequireDrained: as CheckpointOptions.RequireDrained, passed to kcr's
	// CRIU action script in runc's environment (RequireDrainedEnv).
	RequireDrained bool
	// AllowDuplicates: as RestoreOptions.AllowDuplicates.
	AllowDuplicates bool
	// MaxSize bounds the image a checkpoint archive may unpack to
	// (default images.DefaultMaxImportSize).
	MaxSize int64

	env        []string // added to runc's environment, which CRIU's script inherits
	generation uint64   // the restore's generation, if counted elsewhere (restoreArchive)
}

// GenerationEnv tells kcr's CRIU action script the restore's generation.
const GenerationEnv = runtimehook.GenerationEnv

// RequireDrainedEnv, set to 1 in runc's environment, makes kcr's CRIU action
// script ask the apps for a checkpoint without carried records
// (runtimehook.RequireDrainedEnv).
const RequireDrainedEnv = runtimehook.EnvRequireDrained

// ContainerState is what "runc state" says of a container.
type ContainerState struct {
	ID          string            `json:"id"`
	PID         int               `json:"pid"`
	Status      string            `json:"status"`
	Bundle      string            `json:"bundle"`
	Annotations map[string]string `json:"annotations"`
}

func (o *ContainerOptions) runc(ctx context.Context, stdout *os.File, args ...string) (string, error) {
	bin := o.Runtime
	if bin == "" {
		bin = "runc"
	}
	if o.RuncRoot != "" {
		args = append([]string{"--root", o.RuncRoot}, args...)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	if o.env != nil {
		cmd.Env = append(os.Environ(), o.env...)
	}
	var out bytes.Buffer
	if stdout != nil {
		// Files, not pipes of ours: the container keeps them and kcr
		// must not wait for it.
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return "", err
		}
		defer devnull.Close()
		cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, stdout, stdout
	} else {
		cmd.Stdout, cmd.Stderr = &out, &out
	}
	err := cmd.Run()
	if errors.Is(err, exec.ErrNotFound) {
		return "", fmt.Errorf("%s not found: install runc (scripts/install-runc.sh) or name it with --runtime", bin)
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %w: %s", bin, args[len(args)-1], ErrRuntimeFailed, err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// trusted says whether images must pass images.OpenOptions.Trusted: as
// root, unless AllowUntrusted.
func (o *ContainerOptions) trusted() bool { return os.Geteuid() == 0 && !o.AllowUntrusted }

// State returns "runc state" of the container.
func (o *ContainerOptions) State(ctx context.Context) (*ContainerState, error) {
	out, err := o.runc(ctx, nil, "state", o.ID)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w: %w", o.ID, ErrContainerState, err)
	}
	var st ContainerState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("runc state %s: %w", o.ID, err)
	}
	return &st, nil
}

// criuConfigHasHook says whether the CRIU configuration runc gives this
// container (org.criu.config, else /etc/criu/runc.conf) names an action script.
func criuConfigHasHook(st *ContainerState) (string, bool) {
	conf := "/etc/criu/runc.conf"
	if c := st.Annotations["org.criu.config"]; c != "" {
		conf = c
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		return conf, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == "action-script" || f[0] == "--action-script") {
			return conf, true
		}
	}
	return conf, false
}

// hasKCRSocket says whether a process of pid's tree has a kcr control
// socket: its hooks must run.
func hasKCRSocket(pid int) bool {
	for _, p := range criu.ProcessTree(pid) {
		if _, err := client.Find(p); err == nil {
			return true
		}
	}
	return false
}

// startImage reads what the manifest records of the container's init pid
// and starts the image out, signed with key if not nil.
func startImage(pid int, out string, key ed25519.PrivateKey) (images.Process, *images.Builder, error) {
	proc, err := processInfo(pid)
	if err != nil {
		return proc, nil, err
	}
	b, err := createImage(out, key)
	return proc, b, err
}

// createImage starts the image out, signed with key if not nil. Callers
// defer b.Abort() at once: it removes the unfinished image on every failure
// and is a no-op after a successful Commit.
func createImage(out string, key ed25519.PrivateKey) (*images.Builder, error) {
	b, err := images.Create(out)
	if err != nil {
		return nil, err
	}
	b.SignWith(key)
	return b, nil
}

// needHook refuses a container whose CRIU configuration would not run
// kcr's hook.
func needHook(id string, st *ContainerState) error {
	if conf, ok := criuConfigHasHook(st); !ok {
		return fmt.Errorf("container %s has a kcr control socket, but %s names no action-script: %w; run kcr install-runtime-hook", id, conf, ErrNoRuntimeHook)
	}
	return nil
}

// containerBundleFile, in the image's directory, names the container and
// the bundle it was checkpointed from.
const containerBundleFile = "container.json"

// containerSpecFile, in the image's directory, is the bundle's config.json
// at checkpoint time: verified with the image, it is the spec a restore
// from an archive runs (and the archive's spec.dump).
const containerSpecFile = "container-spec.json"

// CheckpointContainer checkpoints a runc container with "runc checkpoint"
// into a kcr image: runc's images in its criu/ directory, the manifest
// beside them. The app's hooks run in kcr's CRIU action script
// (kcr install-runtime-hook), whose reports go into the manifest.
func CheckpointContainer(ctx context.Context, o ContainerOptions) (*CheckpointResult, error) {
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
	proc, b, err := startImage(st.PID, o.Output, o.SignKey)
	if err != nil {
		return nil, err
	}
	defer b.Abort() // removes the unfinished image; a no-op once committed
	if err := os.MkdirAll(b.CRIUDir(), 0o700); err != nil {
		return nil, err
	}
	res := &CheckpointResult{Image: b.Final()}
	args := []string{"checkpoint", "--image-path", b.CRIUDir(), "--work-path", b.CRIUDir()}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	if o.RequireDrained {
		o.env = append(o.env, RequireDrainedEnv+"=1")
	}
	t := time.Now()
	_, err = o.runc(ctx, nil, append(args, o.ID)...)
	res.Timings.add(PhaseRuncCheckpoint, time.Since(t))
	if err != nil {
		dumpLog := filepath.Join(b.CRIUDir(), "dump.log")
		if tail := logTail(dumpLog, notify.CarryMarker); tail != "" {
			// The script keeps no reports when it refuses: its log line
			// names the resource and the count.
			return nil, &HookError{Reports: []proto.HookReport{{Name: "container " + o.ID, Error: tail, CarryVeto: true}}, Msg: tail}
		}
		if he := failedHooks(filepath.Join(b.CRIUDir(), HookReportsFile)); he != nil {
			return nil, he
		}
		// The unfinished image, with CRIU's log, is removed: keep its last error.
		return nil, fmt.Errorf("container %s: %w (CRIU: %s)", o.ID, err, logTail(filepath.Join(b.CRIUDir(), "dump.log"), "Error"))
	}

	spec, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("container %s: bundle: %w", o.ID, err)
	}
	if err := os.WriteFile(filepath.Join(b.Dir(), containerSpecFile), spec, 0o600); err != nil {
		return nil, err
	}
	reports, _ := os.ReadFile(filepath.Join(b.CRIUDir(), HookReportsFile))
	if err := commitContainer(ctx, b, res, proc, hasSock, reports, o, containerRecord{ID: o.ID, Bundle: st.Bundle}); err != nil {
		return nil, err
	}
	res.Timings.add(PhaseTotal, time.Since(start))
	return res, nil
}

// containerRecord is containerBundleFile: what a restore needs to know of
// the checkpointed container.
type containerRecord struct {
	ID      string `json:"id"`
	Bundle  string `json:"bundle,omitempty"`  // runc
	Runtime string `json:"runtime,omitempty"` // "podman", or runc's ""
}

// commitContainer writes the manifest of a container image, with the
// hooks' reports that kcr's action script left (reports, may be nil), and
// commits it.
func commitContainer(ctx context.Context, b *images.Builder, res *CheckpointResult, proc images.Process, hasSock bool, reports []byte, o ContainerOptions, rec containerRecord) error {
	m := &images.Manifest{KCRVersion: Version, Kernel: kernel(), Host: hostname(), Process: proc, NoHooks: !hasSock,
		Options: images.Options{LeaveRunning: o.LeaveRunning, TCPClose: o.TCPClose}}
	if _, v, err := CRIU(ctx, ""); err == nil {
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
			addResources(m, tg.Reports)
			slowest = max(slowest, d)
		}
		if len(hr.Targets) > 0 {
			res.Timings = append(Timings{{Name: PhaseHooks, DurationNS: int64(slowest)}}, res.Timings...)
		}
	} else if hasSock {
		res.Warnings = append(res.Warnings, "the hook's reports ("+HookReportsFile+") are missing: see CRIU's dump.log")
	}
	cb, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(b.Dir(), containerBundleFile), cb, 0o600); err != nil {
		return err
	}
	t := time.Now()
	m.Phases = append(m.Phases, res.Timings...)
	img, err := b.Commit(context.WithoutCancel(ctx), m)
	if err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	res.Timings.add(PhaseImageWrite, time.Since(t))
	res.Manifest = img.Manifest
	return nil
}

// failedHooks returns the HookError that kcr's action script recorded in
// its reports file when before-checkpoint hooks failed, or nil if none did
// (or there are no reports).
func failedHooks(reportsFile string) *HookError {
	b, err := os.ReadFile(reportsFile)
	if err != nil {
		return nil
	}
	var res runtimehook.Result
	if json.Unmarshal(b, &res) != nil {
		return nil
	}
	he := &HookError{}
	var msgs []string
	for _, t := range res.Targets {
		if t.Error == "" {
			continue
		}
		msgs = append(msgs, fmt.Sprintf("PID %d: %s", t.PID, t.Error))
		he.Reports = append(he.Reports, t.Reports...)
	}
	if len(msgs) == 0 {
		return nil
	}
	he.Msg = strings.Join(msgs, "; ")
	return he
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

// ContainerRestoreResult describes a restored container.
type ContainerRestoreResult struct {
	ID         string
	PID        int
	Generation uint64
	Timings    Timings
	// Bundle is the bundle runc restored into: o.Bundle, or for an
	// archive, one kcr built from the checkpointed spec.
	Bundle string
}

// RestoreContainer verifies a kcr image of a container and restores it
// with "runc restore -d". The app's after-restore hooks run in kcr's CRIU
// action script, at post-resume. If o.Image is a file, it is a checkpoint
// archive of "kcr export --format cri-o" (see restoreArchive); if it is an
// OCI image layout, one of "kcr export --format oci" (restoreOCILayout).
//
// CRIU's work directory (restore.log, where the hook logs too) is removed
// once the restore succeeded; after a failure it stays, and the error
// names it.
func RestoreContainer(ctx context.Context, o ContainerOptions) (*ContainerRestoreResult, error) {
	fi, err := os.Stat(o.Image)
	archive := err == nil && fi.Mode().IsRegular()
	_, err = os.Stat(filepath.Join(o.Image, "oci-layout"))
	layout := err == nil
	if (archive || layout) && o.trusted() {
		if err := images.CheckTrusted(o.Image); err != nil {
			return nil, err
		}
	}
	switch {
	case archive:
		return restoreArchive(ctx, o)
	case layout:
		return restoreOCILayout(ctx, o)
	}
	return restoreContainer(ctx, o, "")
}

// restoreContainer restores the image o.Image; CRIU works in a new
// directory under workParent (default $TMPDIR).
func restoreContainer(ctx context.Context, o ContainerOptions, workParent string) (_ *ContainerRestoreResult, err error) {
	start := time.Now()
	res := &ContainerRestoreResult{ID: o.ID}
	t := time.Now()
	img, err := images.OpenWith(ctx, o.Image, openOptions(false, o.AllowUntrusted, o.VerifyKeys))
	if err != nil {
		return nil, err
	}
	// runc hands CRIU the image by path, so the directory fd cannot be
	// passed on: the trust check above is what keeps the path honest.
	defer img.Close()
	res.Timings.add(PhaseVerify, time.Since(t))
	if err := checkDuplicates(o.Image, img.Manifest, 1, o.AllowDuplicates); err != nil {
		return nil, err
	}
	if rec, err := readContainerRecord(img.Dir); err == nil && rec.Runtime == "podman" {
		r, err := restorePodman(ctx, o, img, rec)
		if r != nil {
			r.Timings = append(res.Timings, r.Timings...)
		}
		return r, err
	}
	if o.Bundle == "" {
		id, bundle, err := readContainerFile(img.Dir)
		if err != nil {
			return nil, fmt.Errorf("%w; restore it with kcr restore IMAGE, or give --bundle", err)
		}
		o.Bundle = bundle
		if o.ID == "" {
			o.ID = id
		}
	}
	res.ID, res.Bundle = o.ID, o.Bundle
	dst := o.Stdout
	if dst == "" {
		dst = os.DevNull
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("container output: %w", err)
	}
	defer out.Close()
	gen := o.generation
	if gen == 0 {
		if gen, err = nextGeneration(img.Dir); err != nil {
			return nil, err
		}
	}
	res.Generation = gen
	// CRIU writes restore.log and stats into its work directory: outside
	// the sealed image.
	work, err := os.MkdirTemp(workParent, "kcr-restore-"+o.ID+"-")
	if err != nil {
		return nil, fmt.Errorf("restore work directory: %w", err)
	}
	defer func() {
		if err == nil {
			os.RemoveAll(work)
		}
	}()
	log := filepath.Join(work, "restore.log")
	crDir := filepath.Join(img.Dir, images.CRIUSubdir)
	args := []string{"restore", "-d", "--image-path", crDir, "--work-path", work, "--bundle", o.Bundle}
	o.env = []string{GenerationEnv + "=" + strconv.FormatUint(gen, 10)}
	t = time.Now()
	if _, err := o.runc(ctx, out, append(args, o.ID)...); err != nil {
		return nil, fmt.Errorf("container %s: %w (CRIU's log, kept: %s)", o.ID, err, log)
	}
	res.Timings.add(PhaseRuncRestore, time.Since(t))
	st, err := o.State(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w (CRIU's log, kept: %s)", err, log)
	}
	res.PID = st.PID
	res.Timings.add(PhaseTotal, time.Since(start))
	return res, nil
}
