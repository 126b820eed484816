package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

func TestBindRace(t *testing.T) {
	for _, c := range []struct {
		cause criu.Cause
		want  bool
	}{
		{criu.CauseUnixBindInUse, true},
		{criu.CauseFileVanished, true},
		{criu.CauseTCPEstablished, false},
		{criu.CausePIDInUse, false},
		{criu.CauseUnknown, false},
	} {
		err := fmt.Errorf("clone 2: %w", &criu.Error{Op: "restore", Cause: c.cause})
		if got := bindRace(err); got != c.want {
			t.Errorf("bindRace(%s) = %v, want %v", c.cause, got, c.want)
		}
	}
	if bindRace(errors.New("Address already in use")) {
		t.Error("a plain error is not a CRIU bind race")
	}
}

// fakeRestorer is CRIU's restore: it hands out PIDs from 5001, or fails the
// calls numbered in fail (from 1).
type fakeRestorer struct {
	fail map[int]error

	mu    sync.Mutex
	calls int
	dirs  []string
}

// Start starts nothing: Restore does it all.
func (r *fakeRestorer) Start(context.Context, string, ...*os.File) (*criu.RestoreSession, error) {
	return nil, nil
}

func (r *fakeRestorer) Restore(ctx context.Context, criuPath string, o criu.RestoreOptions) (*criu.RestoreResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.dirs = append(r.dirs, o.ImagesDir)
	if err := r.fail[r.calls]; err != nil {
		return nil, err
	}
	// As CRIU: a failed post-restore notification aborts the restore.
	if o.Notify != nil {
		if err := o.Notify("post-restore", 5000+r.calls); err != nil {
			return nil, &criu.Error{Op: "restore", Err: err}
		}
	}
	return &criu.RestoreResult{PID: 5000 + r.calls, LogPath: filepath.Join(o.WorkDir, "restore.log")}, nil
}

// restoreFixture is an image checkpointed through the fake deps from an app
// with these reports, and the deps to restore it through app and r.
type restoreFixture struct {
	image string
	app   *fakeApp
	r     *fakeRestorer
	s     deps
}

func newRestoreFixture(t *testing.T, pidNamespace bool, reports []proto.HookReport) *restoreFixture {
	t.Helper()
	f := &restoreFixture{image: filepath.Join(t.TempDir(), "img"), app: &fakeApp{pid: 4242, reports: reports}, r: &fakeRestorer{}}
	f.s = fakeDeps(f.app, &fakeDumper{})
	f.s.process = func(pid int) (images.Process, error) {
		return images.Process{PID: pid, Comm: "fake", PIDNamespace: pidNamespace}, nil
	}
	if _, err := f.s.checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: f.image}); err != nil {
		t.Fatal(err)
	}
	f.app.reports = nil
	f.s.findCRIU = func(context.Context, string) (string, error) { return "/fake/criu", nil }
	f.s.pidsFree = func(context.Context, *images.Image, time.Duration) error {
		t.Error("PIDs checked for an image with its own PID namespace")
		return nil
	}
	f.s.restorer = f.r
	// The restored app shows its socket under its new PID at once.
	f.s.findApp = func(pid int) (appControl, string, error) {
		return f.app, filepath.Join("/run/kcr", proto.SocketName(pid)), nil
	}
	f.s.socketWait = 50 * time.Millisecond
	return f
}

// imageKept fails unless the image still verifies.
func imageKept(t *testing.T, dir string) {
	t.Helper()
	img, err := images.Open(context.Background(), dir)
	if err != nil {
		t.Fatalf("image after a failed restore: %v", err)
	}
	img.Close()
}

// A restore through the deps restores the verified image, tells the new
// process its generation and name, and reports the phases.
func TestRestoreSeams(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Name: "svc"})
	if err != nil || len(res) != 1 {
		t.Fatalf("restore: %v, %v", res, err)
	}
	r := res[0]
	if r.PID != 5001 || r.Name != "svc" || r.Generation != 1 || r.InstanceID != "inst-1" || r.HookErr != nil || r.HooksPending || len(r.Reports) != 1 {
		t.Errorf("result %+v", r)
	}
	for _, ph := range []string{PhaseVerify, PhaseCRIUVersion, PhaseGeneration, PhaseRestore, PhaseAfterHooks, PhaseTotal} {
		if r.Timings.Get(ph) <= 0 {
			t.Errorf("no %s phase in %v", ph, r.Timings)
		}
	}
	if len(f.app.restored) != 1 || f.app.restored[0] != "svc" || f.r.calls != 1 || !strings.HasPrefix(f.r.dirs[0], f.image) {
		t.Errorf("after-restore %q, restores %d in %q", f.app.restored, f.r.calls, f.r.dirs)
	}
}

// A failed CRIU restore returns CRIU's error and no process, tells no app
// anything, and keeps the image for another try.
func TestRestoreSeamsCRIUFails(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	f.r.fail = map[int]error{1: &criu.Error{Op: "restore", Cause: criu.CauseTCPEstablished, First: "Can't restore TCP"}}
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image})
	var ce *criu.Error
	if !errors.As(err, &ce) || res != nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("restore: %v, %q", res, err)
	}
	if len(f.app.restored) != 0 {
		t.Errorf("a failed restore sent after-restore to %q", f.app.restored)
	}
	imageKept(t, f.image)
	// The next restore is the next generation: a failed one is counted too.
	f.r.fail = nil
	r, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image})
	if err != nil || r[0].Generation != 2 {
		t.Fatalf("restore after the failed one: %+v, %v", r, err)
	}
}

// When the after-restore message fails, times out, is interrupted or finds
// no socket, the process runs: the restore succeeds and says so in HookErr/HooksPending.
func TestRestoreSeamsAfterRestore(t *testing.T) {
	for _, c := range []struct {
		name     string
		err      error // RestoredAs's
		noSocket bool
		pending  bool
		hookErr  func(error) bool
	}{
		{name: "hooks fail", err: &proto.HookFailure{Msg: "kafka: rejoin failed"},
			hookErr: func(err error) bool { var hf *proto.HookFailure; return errors.As(err, &hf) }},
		{name: "hooks pending", err: client.ErrPending, pending: true},
		// kcr interrupted while it waits: the process still runs and its PID
		// is reported.
		{name: "interrupted", err: fmt.Errorf("restored: %w", context.Canceled),
			hookErr: func(err error) bool { return errors.Is(err, context.Canceled) }},
		{name: "no socket", noSocket: true,
			hookErr: func(err error) bool {
				return errors.Is(err, client.ErrNoSocket) && strings.Contains(err.Error(), "restored process 5001")
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newRestoreFixture(t, true, nil)
			f.app.restoreErr = c.err
			if c.noSocket {
				f.s.findApp = func(int) (appControl, string, error) { return nil, "", client.ErrNoSocket }
			}
			res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image})
			if err != nil || len(res) != 1 || res[0].PID != 5001 {
				t.Fatalf("restore: %v, %v", res, err)
			}
			r := res[0]
			if r.HooksPending != c.pending || (c.hookErr == nil) != (r.HookErr == nil) || c.hookErr != nil && !c.hookErr(r.HookErr) {
				t.Errorf("pending %v, hook error %v", r.HooksPending, r.HookErr)
			}
		})
	}
}

// A clone that fails does not stop the others: they keep running and are
// returned with an error that counts the failures.
func TestRestoreSeamsCloneFails(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	f.r.fail = map[int]error{2: &criu.Error{Op: "restore", Cause: criu.CauseUnknown, First: "Can't fork"}}
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Count: 3, Name: "w", WorkDir: t.TempDir()})
	var ce *criu.Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "1 of 3 clones failed") {
		t.Fatalf("error %v", err)
	}
	if len(res) != 2 || f.r.calls != 3 {
		t.Fatalf("%d clones returned, %d restores", len(res), f.r.calls)
	}
	names := map[string]bool{}
	gens := map[uint64]bool{}
	for _, r := range res {
		names[r.Name], gens[r.Generation] = true, true
		if r.PID == 0 || r.HookErr != nil || r.InstanceID == "" {
			t.Errorf("clone %+v", r)
		}
	}
	if len(names) != 2 || len(gens) != 2 || len(f.app.restored) != 2 {
		t.Errorf("names %v, generations %v, notified %q", names, gens, f.app.restored)
	}
	for n := range names {
		if n != "w-1" && n != "w-2" && n != "w-3" {
			t.Errorf("clone name %q", n)
		}
	}
}

// A clone whose CRIU lost a bind race with a sibling is restored again.
func TestRestoreSeamsCloneBindRace(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	f.r.fail = map[int]error{1: &criu.Error{Op: "restore", Cause: criu.CauseUnixBindInUse}}
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Count: 2, WorkDir: t.TempDir()})
	if err != nil || len(res) != 2 || f.r.calls != 3 {
		t.Fatalf("restore: %d clones, %d restores, %v", len(res), f.r.calls, err)
	}
}

// An image that carries records is not restored twice, nor is CRIU started,
// unless duplicates are allowed.
func TestRestoreSeamsCarried(t *testing.T) {
	f := newRestoreFixture(t, true, []proto.HookReport{{Name: "kafka-writer/t", Carried: 5}})
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Count: 2})
	if !errors.Is(err, ErrDuplicates) || res != nil || f.r.calls != 0 {
		t.Fatalf("restore: %v, %v, %d restores", res, err, f.r.calls)
	}
	imageKept(t, f.image)
	res, err = f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Count: 2, AllowDuplicates: true, WorkDir: t.TempDir()})
	if err != nil || len(res) != 2 {
		t.Fatalf("allowed: %v, %v", res, err)
	}
}

// An interrupt while the image is verified starts no CRIU, and the error is
// context.Canceled (kcr exits 130).
func TestRestoreSeamsCancelled(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := f.s.restoreClones(ctx, RestoreOptions{Image: f.image, AfterVerify: cancel})
	if !errors.Is(err, context.Canceled) || res != nil || f.r.calls != 0 {
		t.Fatalf("restore: %v, %v, %d restores", res, err, f.r.calls)
	}
	imageKept(t, f.image)
}

// An image without its own PID namespace needs its PIDs: kcr waits for them
// (PIDWait, 5 s by default), records a long wait, and restores nothing while
// they are taken.
func TestRestoreSeamsPIDWait(t *testing.T) {
	f := newRestoreFixture(t, false, nil)
	busy := &criu.Error{Op: "restore", Cause: criu.CausePIDInUse, First: "PID 4242 is in use"}
	var waits []time.Duration
	f.s.pidsFree = func(_ context.Context, _ *images.Image, wait time.Duration) error {
		waits = append(waits, wait)
		return busy
	}
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image})
	if !errors.Is(err, busy) || res != nil || f.r.calls != 0 {
		t.Fatalf("restore: %v, %v, %d restores", res, err, f.r.calls)
	}
	f.s.pidsFree = func(_ context.Context, _ *images.Image, wait time.Duration) error {
		waits = append(waits, wait)
		time.Sleep(60 * time.Millisecond) // a zombie being reaped
		return nil
	}
	res, err = f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, PIDWait: time.Second})
	if err != nil || len(res) != 1 || f.r.calls != 1 {
		t.Fatalf("restore: %v, %v", res, err)
	}
	if len(waits) != 2 || waits[0] != 5*time.Second || waits[1] != time.Second {
		t.Errorf("PID waits %v, want [5s 1s]", waits)
	}
	if res[0].Timings.Get(PhasePIDWait) < 60*time.Millisecond {
		t.Errorf("no pid wait phase in %v", res[0].Timings)
	}
}

// A restore whose count cannot be written is aborted by failing CRIU's
// post-restore notification (the count is written while CRIU restores):
// no process is left running untold, the error names the counter, and the
// image is kept.
func TestRestoreSeamsGenerationFails(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	if err := os.Mkdir(filepath.Join(f.image, images.GenerationName), 0o700); err != nil {
		t.Fatal(err)
	}
	res, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image})
	if err == nil || res != nil || !strings.Contains(err.Error(), "restore counter") || !strings.Contains(err.Error(), "aborted before it resumed") {
		t.Fatalf("restore: %v, %v", res, err)
	}
	if f.r.calls != 1 || len(f.app.restored) != 0 {
		t.Errorf("%d restores, after-restore sent to %q", f.r.calls, f.app.restored)
	}
	if err := os.Remove(filepath.Join(f.image, images.GenerationName)); err != nil {
		t.Fatal(err)
	}
	imageKept(t, f.image)
}
