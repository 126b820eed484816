// Package engine orchestrates kcr's commands: it talks to the target over
// its control socket (notify/client), drives CRIU (criu) and writes and
// verifies images (images). It returns results and errors; it never prints.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
)

// Version is kcr's version, recorded in every image.
var Version = "0.1.0-dev"

// Phase names, in the order they happen.
const (
	PhaseHooks      = "hooks"
	PhaseFreezeDump = "freeze+dump"
	PhaseExit       = "exit"
	PhaseImageWrite = "image write"
	PhaseResume     = "resume hooks"
	PhaseVerify     = "verify"
	PhaseRestore    = "restore"
	PhaseAfterHooks = "after-restore hooks"
	PhaseTotal      = "total"
	PhasePIDWait    = "pid wait"
	// PhasePrepare is kcr's work until CRIU has the dump request: reading
	// the process, starting CRIU and checking its version, creating the
	// image directory. The preflight and the socket search follow, while
	// CRIU prepares.
	PhasePrepare = "prepare"
	// PhaseDraft writes the draft manifest that "kcr recover" needs.
	PhaseDraft = "draft manifest"
	// PhasePrehash hashes and syncs the pages at CRIU's post-dump stage
	// (an abandonable checkpoint), inside PhaseFreezeDump.
	PhasePrehash = "prehash pages"
	// PhaseCRIUExit is the wait for CRIU's exit left after the image write.
	PhaseCRIUExit = "criu exit"
	// PhaseCRIUReady is what kcr still waited, once its own preparation
	// (preflight, socket search, CRIU's version) was done, for CRIU's: its
	// start and its probing of the kernel. The hooks run after it.
	PhaseCRIUReady = "criu ready wait"
	// PhaseCRIUVersion is what a restore still waited for CRIU's version
	// check once the image was verified (they run side by side).
	PhaseCRIUVersion = "criu version wait"
	// PhaseGeneration counts the restore in the image's durable counter.
	PhaseGeneration = "generation"
	// The parts of PhaseRestore, split at CRIU's notifications: from the
	// request to the first notification (kernel probing, reading the
	// images), the restore of the tasks until the last, then CRIU's
	// answer. CRIU's exit is not waited for.
	PhaseCRIUStart  = "criu: start"
	PhaseCRIUTasks  = "criu: tasks"
	PhaseCRIUAnswer = "criu: answer"
)

// Timings records phase durations in order.
type Timings []images.Phase

func (t *Timings) Add(name string, d time.Duration) {
	*t = append(*t, images.Phase{Name: name, DurationNS: int64(d)})
}

// Get returns the duration of the named phase, or 0.
func (t Timings) Get(name string) time.Duration {
	for _, p := range t {
		if p.Name == name {
			return p.Duration()
		}
	}
	return 0
}

// CRIU locates CRIU and checks that it works on this kernel.
func CRIU(ctx context.Context, explicit string) (path string, v criu.Version, err error) {
	path, err = criu.Find(explicit)
	if err != nil {
		return "", v, err
	}
	v, err = checkVersion(ctx, path)
	return path, v, err
}

// checkVersion reads CRIU's version and checks it against the kernel.
func checkVersion(ctx context.Context, path string) (criu.Version, error) {
	v, err := readVersionCached(ctx, path)
	return checkedVersion(path, v, err)
}

// checkedVersion is the outcome of reading the version of the CRIU at path
// (v, err), checked against the kernel.
func checkedVersion(path string, v criu.Version, err error) (criu.Version, error) {
	if err != nil {
		return v, fmt.Errorf("%w: %s: %w (reinstall it with scripts/install-criu.sh)", ErrCRIUUnusable, path, err)
	}
	rel, err := criu.KernelRelease()
	if err != nil {
		return v, err
	}
	if err := criu.CheckKernel(v, rel); err != nil {
		return v, fmt.Errorf("%w: %s: %w", ErrCRIUUnusable, path, err)
	}
	return v, nil
}

// startSession finds and starts CRIU for a dump; the session's Version,
// answered by that CRIU, is checked with checkedVersion.
func startSession(ctx context.Context, explicit string, o criu.SessionOptions) (*criu.Session, error) {
	path, err := criu.Find(explicit)
	if err != nil {
		return nil, err
	}
	s, err := criu.StartDumpSession(ctx, path, o)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w (reinstall it with scripts/install-criu.sh)", ErrCRIUUnusable, path, err)
	}
	return s, nil
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// ErrCRIUUnusable is wrapped when the CRIU found cannot work on this kernel.
var ErrCRIUUnusable = errors.New("criu unusable")
