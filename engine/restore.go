package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	Image string
	CRIU  string // explicit CRIU path (--criu)
	// HookWait is how long to wait for the app's after-restore hooks
	// before reporting them as pending (default 30 s).
	HookWait time.Duration
	// PIDWait is how long a PID held by a zombie may take to be reaped.
	PIDWait time.Duration
	// WorkDir receives CRIU's restore log (default: a new directory under
	// $TMPDIR/kcr-restore-*).
	WorkDir string
	Logger  *slog.Logger
}

// RestoreResult describes a restored process.
type RestoreResult struct {
	PID        int
	Generation uint64
	InstanceID string
	Timings    Timings
	LogPath    string
	Reports    []proto.HookReport
	// HooksPending is set when the app had not finished its after-restore
	// hooks within HookWait; it goes on with them by itself.
	HooksPending bool
	// HookErr is set when after-restore hooks failed. The process runs.
	HookErr error
}

// Restore verifies an image, restores it with CRIU, and tells the restored
// process that it is a new instance.
func Restore(ctx context.Context, o RestoreOptions) (*RestoreResult, error) {
	start := time.Now()
	if o.HookWait <= 0 {
		o.HookWait = 30 * time.Second
	}
	if o.PIDWait <= 0 {
		o.PIDWait = 5 * time.Second
	}
	res := &RestoreResult{}

	t := time.Now()
	img, err := images.Open(ctx, o.Image)
	if err != nil {
		return nil, err
	}
	res.Timings.add(PhaseVerify, time.Since(t))
	m := img.Manifest

	criuPath, _, err := CRIU(ctx, o.CRIU)
	if err != nil {
		return nil, err
	}

	t = time.Now()
	if err := criu.CheckImagePIDsFree(ctx, img.CRIUDir(), o.PIDWait); err != nil {
		return nil, err
	}
	if w := time.Since(t); w > 50*time.Millisecond {
		res.Timings.add(PhasePIDWait, w)
	}

	work := o.WorkDir
	if work == "" {
		work, err = os.MkdirTemp("", "kcr-restore-")
		if err != nil {
			return nil, fmt.Errorf("restore work directory: %w", err)
		}
	}
	gen, err := nextGeneration(img.Dir)
	if err != nil {
		return nil, err
	}
	res.Generation = gen

	t = time.Now()
	rr, err := criu.Restore(ctx, criuPath, criu.RestoreOptions{
		ImagesDir: img.CRIUDir(), WorkDir: work,
		TCPClose: m.Options.TCPClose, ShellJob: m.Options.ShellJob, FileLocks: m.Options.FileLocks,
	})
	res.Timings.add(PhaseRestore, time.Since(t))
	if err != nil {
		return nil, err
	}
	res.PID = rr.PID
	res.LogPath = rr.LogPath

	if !m.NoHooks {
		t = time.Now()
		done, err := afterRestore(ctx, rr.PID, gen, o.HookWait)
		res.Timings.add(PhaseAfterHooks, time.Since(t))
		res.Reports = done.Reports
		res.InstanceID = done.InstanceID
		switch {
		case errors.Is(err, client.ErrPending):
			res.HooksPending = true
		case err != nil:
			res.HookErr = err
		}
	}
	res.Timings.add(PhaseTotal, time.Since(start))
	return res, nil
}

// afterRestore sends the restored message. The socket was restored by CRIU,
// so it is found through the new PID like any other.
func afterRestore(ctx context.Context, pid int, gen uint64, wait time.Duration) (proto.Message, error) {
	sock, err := client.Find(pid)
	if err != nil {
		return proto.Message{}, fmt.Errorf("restored process %d: %w", pid, err)
	}
	return client.Restored(ctx, sock, gen, wait)
}

// generationFile counts the restores of an image on this host. It is not
// part of the manifest: restores do not change what was checkpointed.
const generationFile = "restores"

// nextGeneration increments the image's restore counter under a lock, so
// that concurrent restores of one image get distinct generations.
func nextGeneration(dir string) (uint64, error) {
	p := filepath.Join(dir, generationFile)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, fmt.Errorf("restore counter %s: %w", p, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return 0, fmt.Errorf("lock restore counter %s: %w", p, err)
	}
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	cur, _ := strconv.ParseUint(strings.TrimSpace(string(b[:n])), 10, 64)
	cur++
	if err := f.Truncate(0); err != nil {
		return 0, err
	}
	if _, err := f.WriteAt([]byte(strconv.FormatUint(cur, 10)+"\n"), 0); err != nil {
		return 0, fmt.Errorf("write restore counter %s: %w", p, err)
	}
	return cur, f.Sync()
}
