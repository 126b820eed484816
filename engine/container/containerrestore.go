package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
)

// ContainerRestoreResult describes a restored container.
type ContainerRestoreResult struct {
	ID         string         // the container's id
	PID        int            // its init process, on the host
	Generation uint64         // this restore's count of the image
	Timings    engine.Timings // the phases and how long they took
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
func RestoreContainer(ctx context.Context, o RestoreOptions) (*ContainerRestoreResult, error) {
	if o.Bundle != "" {
		// Before the image: runc would only say that it failed.
		if _, err := os.Stat(filepath.Join(o.Bundle, "config.json")); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("--bundle %s: no config.json in it (%w): give the bundle directory to restore into, or leave --bundle out", o.Bundle, syscall.ENOENT)
		}
	}
	if real, err := filepath.EvalSymlinks(o.Image); err == nil && o.trusted() {
		// Links resolved once, and the resolved path checked and used: a
		// link could be pointed elsewhere after the check.
		o.Image = real
	}
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
func restoreContainer(ctx context.Context, o RestoreOptions, workParent string) (_ *ContainerRestoreResult, err error) {
	start := time.Now()
	res := &ContainerRestoreResult{ID: o.ID}
	t := time.Now()
	img, err := images.OpenWith(ctx, o.Image, engine.OpenOptions(false, o.AllowUntrusted, o.VerifyKeys))
	if err != nil {
		return nil, err
	}
	// runc hands CRIU the image by path, so the directory fd cannot be
	// passed on: the trust check above is what keeps the path honest.
	defer img.Close()
	res.Timings.Add(engine.PhaseVerify, time.Since(t))
	if err := engine.CheckDuplicates(o.Image, img.Manifest, 1, o.AllowDuplicates); err != nil {
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
	out, err := openContainerOutput(o.Stdout)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	gen := o.generation
	if gen == 0 {
		if gen, err = images.NextGeneration(img.Dir); err != nil {
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
	o.env = []string{criuaction.GenerationEnv + "=" + strconv.FormatUint(gen, 10)}
	t = time.Now()
	if _, err := o.runc(ctx, out, append(args, o.ID)...); err != nil {
		return nil, fmt.Errorf("container %s: %w (CRIU's log, kept: %s)", o.ID, err, log)
	}
	res.Timings.Add(PhaseRuncRestore, time.Since(t))
	st, err := o.State(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w (CRIU's log, kept: %s)", err, log)
	}
	res.PID = st.PID
	res.Timings.Add(engine.PhaseTotal, time.Since(start))
	return res, nil
}

// openContainerOutput opens the restored container's output file (default
// /dev/null) for appending: never truncated, never through a link or into
// a directory another user can write (images.OpenOutput).
func openContainerOutput(dst string) (*os.File, error) {
	if dst == "" || dst == os.DevNull {
		return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	out, err := images.OpenOutput(dst, true, "another user could point it at a file of root's: give a directory only root can write")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("container output %s: directory %s: %w: create it first, or give another --container-output", dst, filepath.Dir(dst), syscall.ENOENT)
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("container output %s: it is a symlink: give the real path", dst)
	case err != nil:
		return nil, fmt.Errorf("container output: %w", err)
	}
	return out, nil
}
