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

// fakeApp is an app's control socket that records what kcr asks.
type fakeApp struct {
	pid        int
	hookErr    error              // returned by Checkpoint
	reports    []proto.HookReport // Checkpoint's reports (default: one "db")
	restoreErr error              // returned by RestoredAs
	// inHooks, if set, runs in Checkpoint with its ctx; its error is returned.
	inHooks func(context.Context) error

	mu       sync.Mutex
	calls    int
	resumes  []string
	restored []string // the names RestoredAs was given
}

func (a *fakeApp) Checkpoint(ctx context.Context, req client.CheckpointRequest) (proto.Message, error) {
	a.mu.Lock()
	a.calls++
	a.mu.Unlock()
	if a.inHooks != nil {
		if err := a.inHooks(ctx); err != nil {
			return proto.Message{}, err
		}
	}
	if a.hookErr != nil {
		return proto.Message{}, a.hookErr
	}
	reports := a.reports
	if reports == nil {
		reports = []proto.HookReport{{Name: "db", Duration: time.Millisecond}}
	}
	return proto.Message{PID: a.pid, Reports: reports}, nil
}

func (a *fakeApp) Resume(ctx context.Context, reason string, wait time.Duration) (proto.Message, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.resumes = append(a.resumes, reason)
	return proto.Message{}, nil
}

func (a *fakeApp) RestoredAs(ctx context.Context, gen uint64, name string, wait time.Duration) (proto.Message, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.restored = append(a.restored, name)
	if a.restoreErr != nil {
		return proto.Message{}, a.restoreErr
	}
	return proto.Message{InstanceID: fmt.Sprintf("inst-%d", gen), Reports: []proto.HookReport{{Name: "db"}}}, nil
}

// fakeDumper is CRIU: it writes one image file, or fails with err.
type fakeDumper struct {
	err       error
	begun     int
	dumps     int // dumps let go
	cancelled bool
	closed    bool
	// versionErr is the version check's failure.
	versionErr error
	readied    int   // calls of Ready
	readyErr   error // CRIU failed before its pre-dump stage
	o          criu.DumpOptions
	// inGo, if set, runs in Go before it returns (a cancel mid-dump).
	inGo func()
}

func (d *fakeDumper) Begin(o criu.DumpOptions) (pendingDump, error) {
	d.begun++
	d.o = o
	return d, nil
}

func (d *fakeDumper) Ready(ctx context.Context) error {
	d.readied++
	return d.readyErr
}

func (d *fakeDumper) Go(ctx context.Context) (*criu.DumpResult, error) {
	d.dumps++
	if d.inGo != nil {
		d.inGo()
	}
	if d.err != nil {
		return nil, d.err
	}
	if err := os.WriteFile(filepath.Join(d.o.ImagesDir, "pages-1.img"), []byte("pages"), 0o600); err != nil {
		return nil, err
	}
	return &criu.DumpResult{}, nil
}

// Cancel is the engine stopping a begun dump; a no-op after Go.
func (d *fakeDumper) Cancel() {
	if d.dumps == 0 {
		d.cancelled = true
	}
}

func (d *fakeDumper) Close() { d.closed = true }

func (d *fakeDumper) Version() (criu.Version, error) {
	return criu.Version{Major: 4, Minor: 2}, d.versionErr
}

// fakeDeps checkpoint PID 4242 through app and d, nothing real touched.
func fakeDeps(app *fakeApp, d *fakeDumper) deps {
	return deps{
		process: func(pid int) (images.Process, error) {
			return images.Process{PID: pid, Comm: "fake", PIDNamespace: true}, nil
		},
		shellJobNeeded: func(int) (bool, error) { return false, nil },
		preflight:      func(int) ([]criu.Problem, error) { return nil, nil },
		findApp: func(pid int) (appControl, string, error) {
			if app == nil {
				return nil, "", client.ErrNoSocket
			}
			return app, "/run/fake.sock", nil
		},
		openDumper: func(context.Context, string, criu.SessionOptions) (dumper, error) { return d, nil },
		waitGone:   func(context.Context, int, time.Duration) (time.Duration, error) { return 0, nil },
	}
}

// noImage fails if dir holds anything: no image, no hidden temporary one.
func noImage(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("a failed checkpoint left %s in %s", e.Name(), dir)
	}
}

func TestCheckpointSeams(t *testing.T) {
	const pid = 4242
	hookFail := &proto.HookFailure{Reports: []proto.HookReport{{Name: "db", Error: "db: refusing"}}, Msg: "db: refusing"}
	for _, c := range []struct {
		name       string
		hookErr    error
		dumpErr    error
		cancel     bool // kcr is interrupted between the hooks and the dump
		cancelDump bool // kcr abandons the dump while CRIU writes it (CRIU then fails)
		wantErr    func(error) bool
		wantDumps  int
		wantResume string // prefix of the one resume reason; "" for none
	}{
		{name: "dump fails, app resumed", dumpErr: &criu.Error{Op: "dump", First: "Can't dump"},
			wantErr: func(err error) bool { var ce *criu.Error; return errors.As(err, &ce) }, wantDumps: 1, wantResume: "dump failed: "},
		{name: "hook fails, nothing dumped", hookErr: hookFail,
			wantErr: func(err error) bool { var he *proto.HookFailure; return errors.As(err, &he) && !he.CarryVeto() }},
		{name: "cancelled between hooks and dump", cancel: true,
			wantErr: func(err error) bool { return errors.Is(err, context.Canceled) }, wantResume: "checkpoint cancelled"},
		{name: "abandoned during the dump", cancelDump: true, dumpErr: &criu.Error{Op: "dump", Err: context.Canceled},
			wantErr: func(err error) bool { var ce *criu.Error; return errors.As(err, &ce) }, wantDumps: 1, wantResume: "checkpoint cancelled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			app := &fakeApp{pid: pid, hookErr: c.hookErr}
			d := &fakeDumper{err: c.dumpErr}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := CheckpointOptions{PID: pid, Output: filepath.Join(dir, "img")}
			if c.cancel {
				o.AfterHooks = cancel
			}
			if c.cancelDump {
				d.inGo = cancel
			}
			res, err := fakeDeps(app, d).checkpoint(ctx, o)
			if err == nil || !c.wantErr(err) || res != nil {
				t.Fatalf("checkpoint: %v, %v", res, err)
			}
			if d.dumps != c.wantDumps || !d.closed || d.cancelled != (c.wantDumps == 0) {
				t.Errorf("dumps %d (want %d), CRIU session closed %v, begun dump cancelled %v", d.dumps, c.wantDumps, d.closed, d.cancelled)
			}
			if c.wantResume == "" && len(app.resumes) != 0 || c.wantResume != "" && (len(app.resumes) != 1 || !strings.HasPrefix(app.resumes[0], c.wantResume)) {
				t.Errorf("resumes %q, want one starting %q", app.resumes, c.wantResume)
			}
			noImage(t, dir)
		})
	}
}

// An abandonable checkpoint cancelled while the app's hooks run lets them
// finish, then resumes the app: nothing dumped, no image.
func TestCheckpointAbandonedInHooks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	app := &fakeApp{pid: 4242, inHooks: func(hctx context.Context) error {
		cancel()
		return hctx.Err() // the hooks would be cut off
	}}
	d := &fakeDumper{}
	dir := t.TempDir()
	var opened criu.SessionOptions
	ds := fakeDeps(app, d)
	ds.openDumper = func(_ context.Context, _ string, o criu.SessionOptions) (dumper, error) { opened = o; return d, nil }
	res, err := ds.checkpoint(ctx, CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img"), Abandonable: true})
	if !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("checkpoint: %v, %v; want context.Canceled", res, err)
	}
	if !opened.Abandonable {
		t.Error("CRIU's session was not opened abandonable")
	}
	if d.dumps != 0 || len(app.resumes) != 1 || app.resumes[0] != "checkpoint cancelled" {
		t.Errorf("dumps %d, resumes %q; want no dump and one resume", d.dumps, app.resumes)
	}
	noImage(t, dir)
}

// A checkpoint through the deps writes a complete, verifiable image with
// the hooks' reports, and does not resume a dumped app.
func TestCheckpointSeamsImage(t *testing.T) {
	app := &fakeApp{pid: 4242}
	d := &fakeDumper{}
	out := filepath.Join(t.TempDir(), "img")
	res, err := fakeDeps(app, d).checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(app.resumes) != 0 || d.dumps != 1 {
		t.Errorf("resumes %q, dumps %d", app.resumes, d.dumps)
	}
	img, err := images.Open(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if res.Image != out || img.Manifest.ControlSocket != "/run/fake.sock" || len(img.Manifest.Resources) != 1 || img.Manifest.Resources[0].Name != "db" {
		t.Errorf("result %+v, manifest %+v", res, img.Manifest)
	}
}

// Without a control socket, a checkpoint that needs hooks touches nothing.
func TestCheckpointSeamsNoSocket(t *testing.T) {
	dir := t.TempDir()
	d := &fakeDumper{}
	_, err := fakeDeps(nil, d).checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img")})
	if !errors.Is(err, client.ErrNoSocket) || d.dumps != 0 || d.begun == 1 && !d.cancelled {
		t.Fatalf("err %v, dumps %d, begun %d, cancelled %v", err, d.dumps, d.begun, d.cancelled)
	}
	noImage(t, dir)
}

// CRIU has the dump request before the preflight and the socket search run
// (it prepares meanwhile), is ready before the hooks run, so that its
// preparation is not part of the app's disturbance, and is let go only once
// the draft manifest is written.
func TestCheckpointSeamsCRIUPreparesEarly(t *testing.T) {
	app := &fakeApp{pid: 4242}
	d := &fakeDumper{}
	s := fakeDeps(app, d)
	var order []string
	s.preflight = func(int) ([]criu.Problem, error) {
		order = append(order, fmt.Sprintf("preflight begun=%d", d.begun))
		return nil, nil
	}
	findApp := s.findApp
	s.findApp = func(pid int) (appControl, string, error) {
		order = append(order, fmt.Sprintf("socket begun=%d", d.begun))
		return findApp(pid)
	}
	out := filepath.Join(t.TempDir(), "img")
	o := CheckpointOptions{PID: 4242, Output: out, AfterHooks: func() {
		order = append(order, fmt.Sprintf("hooks begun=%d ready=%d dumps=%d", d.begun, d.readied, d.dumps))
	}}
	d2 := &draftChecker{fakeDumper: d, t: t}
	s.openDumper = func(context.Context, string, criu.SessionOptions) (dumper, error) { return d2, nil }
	res, err := s.checkpoint(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"preflight begun=1", "socket begun=1", "hooks begun=1 ready=1 dumps=0", "preflight begun=1"}
	if strings.Join(order, ", ") != strings.Join(want, ", ") || d.dumps != 1 || !d2.drafted {
		t.Errorf("order %q (want %q), dumps %d, draft before Go %v", order, want, d.dumps, d2.drafted)
	}
	if res.Timings.Get(PhasePrepare) <= 0 {
		t.Errorf("timings %+v", res.Timings)
	}
}

// draftChecker is a fakeDumper whose Go checks that the draft manifest is
// already written.
type draftChecker struct {
	*fakeDumper
	t       *testing.T
	drafted bool
}

func (d *draftChecker) Begin(o criu.DumpOptions) (pendingDump, error) {
	d.fakeDumper.Begin(o)
	return d, nil
}

func (d *draftChecker) Go(ctx context.Context) (*criu.DumpResult, error) {
	_, err := os.Stat(filepath.Join(filepath.Dir(d.o.ImagesDir), images.PendingName))
	d.drafted = err == nil
	return d.fakeDumper.Go(ctx)
}

// A process CRIU can never dump (MPTCP) is refused by the preflight after
// CRIU got the request: CRIU is stopped before it touched the app, and no
// image is left.
func TestCheckpointSeamsPreflightCancels(t *testing.T) {
	dir := t.TempDir()
	app := &fakeApp{pid: 4242}
	d := &fakeDumper{}
	s := fakeDeps(app, d)
	s.preflight = func(int) ([]criu.Problem, error) {
		return []criu.Problem{{PID: 4242, FD: 3, Cause: criu.CauseMPTCP, Desc: "MPTCP listener"}}, nil
	}
	_, err := s.checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img")})
	var ce *criu.Error
	if !errors.As(err, &ce) || d.begun != 1 || d.dumps != 0 || !d.cancelled || app.calls != 0 {
		t.Fatalf("err %v, begun %d, dumps %d, cancelled %v, hook calls %d", err, d.begun, d.dumps, d.cancelled, app.calls)
	}
	noImage(t, dir)
}

// A CRIU unfit for the kernel (its own answer to the session's VERSION
// request) is refused before any hook: CRIU is stopped, no image is left.
func TestCheckpointSeamsVersionRefused(t *testing.T) {
	dir := t.TempDir()
	app := &fakeApp{pid: 4242}
	d := &fakeDumper{versionErr: fmt.Errorf("%w: /usr/sbin/criu: CRIU 4.1 on kernel 6.18", ErrCRIUUnusable)}
	_, err := fakeDeps(app, d).checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img")})
	if !errors.Is(err, ErrCRIUUnusable) || app.calls != 0 || d.dumps != 0 || !d.cancelled || !d.closed {
		t.Fatalf("err %v, hook calls %d, dumps %d, cancelled %v, closed %v", err, app.calls, d.dumps, d.cancelled, d.closed)
	}
	noImage(t, dir)
}

// A CRIU that fails before its pre-dump stage fails the checkpoint before
// any hook ran; no image is left.
func TestCheckpointSeamsCRIUNotReady(t *testing.T) {
	dir := t.TempDir()
	app := &fakeApp{pid: 4242}
	d := &fakeDumper{readyErr: &criu.Error{Op: "dump", First: "Can't open images directory"}}
	_, err := fakeDeps(app, d).checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img")})
	var ce *criu.Error
	if !errors.As(err, &ce) || app.calls != 0 || d.dumps != 0 || len(app.resumes) != 0 {
		t.Fatalf("err %v, hook calls %d, dumps %d, resumes %q", err, app.calls, d.dumps, app.resumes)
	}
	noImage(t, dir)
}

// CRIU's log of a failed dump outlives the unfinished image it was written
// into: kept beside the image's path and named in the error.
func TestCheckpointKeepsFailedDumpLog(t *testing.T) {
	dir := t.TempDir()
	d := &fakeDumper{}
	d.inGo = func() {
		log := filepath.Join(d.o.ImagesDir, "dump.log")
		if err := os.WriteFile(log, []byte("Error (criu/cr-dump.c:1): Can't dump\n"), 0o600); err != nil {
			t.Error(err)
		}
		d.err = &criu.Error{Op: "dump", First: "Can't dump", Log: log}
	}
	_, err := fakeDeps(&fakeApp{pid: 4242}, d).checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img")})
	var ce *criu.Error
	if !errors.As(err, &ce) {
		t.Fatalf("checkpoint: %v, want CRIU's error", err)
	}
	want := filepath.Join(dir, "img"+failedDumpLogSuffix)
	if ce.Log != want {
		t.Errorf("the error names the log %q, want %q", ce.Log, want)
	}
	if b, err := os.ReadFile(want); err != nil || !strings.Contains(string(b), "Can't dump") {
		t.Errorf("the kept log: %q, %v", b, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != filepath.Base(want) {
			t.Errorf("a failed checkpoint left %s in %s", e.Name(), dir)
		}
	}
}

// An interrupted checkpoint leaves nothing behind, CRIU's log included.
func TestCheckpointCancelledKeepsNoLog(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &fakeDumper{}
	d.inGo = func() {
		log := filepath.Join(d.o.ImagesDir, "dump.log")
		if err := os.WriteFile(log, []byte("Dumping FAILED\n"), 0o600); err != nil {
			t.Error(err)
		}
		cancel()
		d.err = &criu.Error{Op: "dump", Log: log, Err: context.Canceled}
	}
	if _, err := fakeDeps(&fakeApp{pid: 4242}, d).checkpoint(ctx, CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img")}); err == nil {
		t.Fatal("a cancelled checkpoint succeeded")
	}
	noImage(t, dir)
}
