// Package container checkpoints runc and Podman containers into kcr images,
// restores them, and exports them as CRI-O archives and OCI layouts. It
// builds on engine (images, manifests, timings); engine knows nothing of it.
package container

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
	"strings"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
)

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

// Target names a container and the runtime that runs it: what
// CheckpointOptions and RestoreOptions share.
type Target struct {
	ID       string // the container's id
	Runtime  string // runc binary (default "runc" from PATH), or podman
	RuncRoot string // runc --root (default: runc's)

	env []string // added to runc's environment, which CRIU's script inherits
}

// CheckpointOptions configures CheckpointContainer.
type CheckpointOptions struct {
	Target
	Output       string // image directory to create
	LeaveRunning bool   // runc checkpoint --leave-running
	TCPClose     bool   // refused: runc takes tcp-close only from its CRIU configuration
	// SignKey signs the image's manifest.
	SignKey ed25519.PrivateKey
	// RequireDrained: as engine.CheckpointOptions.RequireDrained, passed to
	// kcr's CRIU action script in runc's environment
	// (criuaction.EnvRequireDrained).
	RequireDrained bool
}

// RestoreOptions configures RestoreContainer.
type RestoreOptions struct {
	Target
	Image  string // the kcr image, a CRI-O archive or an OCI layout
	Bundle string // the bundle (default: the one recorded at checkpoint)
	// Stdout receives the restored container's stdout and stderr (runc
	// hands its own to the container); default /dev/null. kcr's own
	// stdio is never given to the container, so kcr can exit. The file is
	// appended to (created 0600 if missing), never truncated, and opened
	// as images.OpenOutput does: not through a link, and as root only in
	// a directory no other user can write.
	Stdout string
	// VerifyKeys and AllowUntrusted are as in engine.RestoreOptions;
	// AllowUntrusted covers archives and OCI layouts too.
	VerifyKeys     []ed25519.PublicKey
	AllowUntrusted bool
	// AllowDuplicates: as engine.RestoreOptions.AllowDuplicates.
	AllowDuplicates bool
	// MaxSize bounds the image a checkpoint archive may unpack to
	// (default images.DefaultMaxImportSize).
	MaxSize int64

	generation uint64 // the restore's generation, if counted elsewhere (restoreArchive)
}

// ContainerState is what "runc state" says of a container.
type ContainerState struct {
	ID          string            `json:"id"`
	PID         int               `json:"pid"`         // the container's init process, on the host
	Status      string            `json:"status"`      // "running", "paused", "stopped", …
	Bundle      string            `json:"bundle"`      // the bundle directory
	Annotations map[string]string `json:"annotations"` // org.criu.config names its CRIU configuration
}

func (o *Target) runc(ctx context.Context, stdout *os.File, args ...string) (string, error) {
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
func (o *RestoreOptions) trusted() bool { return os.Geteuid() == 0 && !o.AllowUntrusted }

// State returns "runc state" of the container.
func (o *Target) State(ctx context.Context) (*ContainerState, error) {
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
	// As root, read once, bounded, and only a file no other user could
	// have written: the annotation names any path.
	b, err := images.ReadTrustedFile(conf, 1<<20, "a CRIU configuration another user can write decides which script CRIU runs as root: chown root: it and chmod go-w it")
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

// containerRecord is containerBundleFile: what a restore needs to know of
// the checkpointed container.
type containerRecord struct {
	ID      string `json:"id"`
	Bundle  string `json:"bundle,omitempty"`  // runc
	Runtime string `json:"runtime,omitempty"` // "podman", or runc's ""
}

// readContainerRecord returns what a kcr image of a container records of it.
func readContainerRecord(image string) (containerRecord, error) {
	b, err := os.ReadFile(filepath.Join(image, containerBundleFile))
	if err != nil {
		return containerRecord{}, fmt.Errorf("%s is not a container image (no %s): only images of kcr checkpoint --container", image, containerBundleFile)
	}
	return parseContainerRecord(image, b)
}

// parseContainerRecord decodes the content of containerBundleFile.
func parseContainerRecord(image string, b []byte) (containerRecord, error) {
	var c containerRecord
	if json.Unmarshal(b, &c) != nil || (c.Bundle == "" && c.Runtime == "") {
		return c, fmt.Errorf("%s is not a container image (no %s): only images of kcr checkpoint --container", image, containerBundleFile)
	}
	return c, nil
}

// readContainerFile returns the container id and bundle recorded in a kcr
// image of a runc container.
func readContainerFile(image string) (id, bundle string, err error) {
	c, err := readContainerRecord(image)
	if err != nil {
		return "", "", err
	}
	return runcRecord(image, c)
}

// parseContainerFile decodes the content of containerBundleFile of a runc
// container.
func parseContainerFile(image string, b []byte) (id, bundle string, err error) {
	c, err := parseContainerRecord(image, b)
	if err != nil {
		return "", "", err
	}
	return runcRecord(image, c)
}

// runcRecord returns the id and bundle of c, the record of a runc container.
func runcRecord(image string, c containerRecord) (id, bundle string, err error) {
	if c.Runtime == "podman" {
		return "", "", fmt.Errorf("%s is an image of a Podman container: its %s is Podman's own checkpoint archive (podman container restore --import reads it)", image, PodmanArchive)
	}
	return c.ID, c.Bundle, nil
}
