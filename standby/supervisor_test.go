package standby

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
)

// fake is a backend without processes: a "process" is a number that is
// alive until the fake kills it.
type fake struct {
	mu          sync.Mutex
	next        int
	live        map[int]bool
	count       map[int]uint64 // activity per process
	open        map[int]int
	starts      int
	restores    []string
	checkpoints []string
	failRestore map[string]bool
	refuse      int   // checkpoints to refuse (hooks veto) before one succeeds
	restoreErr  error // every restore fails with it
	// touchOnRestore counts activity in a restored process before its
	// restore returns (a record handed before the supervisor looks).
	touchOnRestore bool
	exitInfos      map[int]exitInfo // how a process ended (default: unknown)
	// exitInRestore makes the next restore's process exit in its
	// after-restore hooks.
	exitInRestore bool
	stops         int  // stop calls
	stopHangs     bool // the service ignores SIGTERM
	// ckptDelay delays every checkpoint (a slow dump); it ends early
	// with ctx, failing the checkpoint.
	ckptDelay time.Duration
	// onCheckpoint runs in a successful checkpoint: the service's hooks
	// (its member leaves its group, say).
	onCheckpoint func()
	// restoreHangs makes restores hang until their ctx ends (a stuck CRIU).
	restoreHangs bool
}

func newFake() *fake {
	return &fake{next: 100, live: map[int]bool{}, count: map[int]uint64{}, open: map[int]int{}, failRestore: map[string]bool{}}
}

func (f *fake) spawn() proc {
	f.next++
	f.live[f.next] = true
	return proc{PID: f.next, Start: uint64(f.next)}
}

func (f *fake) start(ctx context.Context) (proc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	return f.spawn(), nil
}

func (f *fake) checkpoint(ctx context.Context, p proc, dir, name string) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.ckptDelay):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse > 0 {
		f.refuse--
		return errors.New("before-checkpoint hooks failed: would carry 3 records")
	}
	if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name, images.ManifestName), []byte("{}"), 0o600); err != nil {
		return err
	}
	if f.onCheckpoint != nil {
		f.onCheckpoint()
	}
	f.checkpoints = append(f.checkpoints, name)
	delete(f.live, p.PID)
	return nil
}

func (f *fake) restore(ctx context.Context, dir, name string) (proc, error) {
	f.mu.Lock()
	if f.restoreHangs {
		f.mu.Unlock()
		<-ctx.Done()
		return proc{}, ctx.Err()
	}
	defer f.mu.Unlock()
	f.restores = append(f.restores, name)
	if f.restoreErr != nil {
		return proc{}, f.restoreErr
	}
	if f.failRestore[name] {
		return proc{}, errors.New("criu restore: bad image")
	}
	p := f.spawn()
	if f.exitInRestore {
		f.exitInRestore = false
		delete(f.live, p.PID)
		return p, errExitedInRestore
	}
	if f.touchOnRestore {
		f.count[p.PID]++
	}
	return p, nil
}

func (f *fake) activity(ctx context.Context, p proc) (notify.Activity, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live[p.PID] {
		return notify.Activity{}, errors.New("no such process")
	}
	return notify.Activity{Count: f.count[p.PID], OpenConns: f.open[p.PID]}, nil
}

func (f *fake) alive(p proc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[p.PID]
}

// copies are the fake's live processes: it models one service.
func (f *fake) copies() []proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []proc
	for pid := range f.live {
		out = append(out, proc{PID: pid, Start: uint64(pid)})
	}
	return out
}

func (f *fake) ready(ctx context.Context, p proc) error { return nil }

// The fake's copies are no processes: it has no orphans to adopt, no
// restore to prepare, no executable to read, no timings and no files.
func (f *fake) adoptCopies()                                    {}
func (f *fake) prepare(ctx context.Context, dir, name string)   {}
func (f *fake) dropPrepared()                                   {}
func (f *fake) exe(p proc) (string, int64, string, bool, error) { return "", 0, "", false, nil }
func (f *fake) lastRestore() (engine.Timings, bool, bool)       { return nil, false, false }
func (f *fake) listenFiles() []*os.File                         { return nil }
func (f *fake) close()                                          {}

func (f *fake) killCopy(p proc) { f.kill(p.PID) }

func (f *fake) exitStatus(p proc) exitInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exitInfos[p.PID]
}

// exit ends pid as e says.
func (f *fake) exit(pid int, e exitInfo) {
	f.mu.Lock()
	if f.exitInfos == nil {
		f.exitInfos = map[int]exitInfo{}
	}
	f.exitInfos[pid] = e
	delete(f.live, pid)
	f.mu.Unlock()
}

// stop stops p at once, unless f.stopHangs: then p is killed when ctx
// ends.
func (f *fake) stop(ctx context.Context, p proc) bool {
	f.mu.Lock()
	hangs := f.stopHangs
	f.stops++
	f.mu.Unlock()
	if hangs {
		<-ctx.Done()
	}
	f.kill(p.PID)
	return hangs
}

func (f *fake) kill(pid int) {
	f.mu.Lock()
	delete(f.live, pid)
	f.mu.Unlock()
}

func (f *fake) touch(pid int) {
	f.mu.Lock()
	f.count[pid]++
	f.mu.Unlock()
}

func (f *fake) snapshot() (starts int, restores, checkpoints []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, append([]string{}, f.restores...), append([]string{}, f.checkpoints...)
}

// recorder is an Observer that keeps what it was told.
type recorder struct {
	mu     sync.Mutex
	states []State
	wakes  []string
	colds  []string
	holds  []string
}

func (r *recorder) State(s State) { r.mu.Lock(); r.states = append(r.states, s); r.mu.Unlock() }
func (r *recorder) Wake(src string, _ time.Duration) {
	r.mu.Lock()
	r.wakes = append(r.wakes, src)
	r.mu.Unlock()
}
func (r *recorder) Checkpoint(time.Duration, int64, error) {}
func (r *recorder) Restore(time.Duration, error)           {}
func (r *recorder) ColdStart(reason string) {
	r.mu.Lock()
	r.colds = append(r.colds, reason)
	r.mu.Unlock()
}
func (r *recorder) BrokerRequests(int) {}
func (r *recorder) GroupHold(result string) {
	r.mu.Lock()
	r.holds = append(r.holds, result)
	r.mu.Unlock()
}

func (r *recorder) holdResults() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string{}, r.holds...)
}

type rig struct {
	t   *testing.T
	f   *fake
	rec *recorder
	s   *Supervisor
	dir string
	log *syncBuf
	end func()
	// Run's end and error: r.runErr.
	done      <-chan struct{}
	err       error
	errWanted bool
}

// runErr waits for Run to return by itself and returns its error.
func (r *rig) runErr() error {
	r.t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.t.Fatalf("Run did not return; log:\n%s", r.log.String())
	}
	r.errWanted = true
	return r.err
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func testOptions(dir string) Options {
	return Options{Args: []string{"true"}, ImageDir: dir, Idle: 150 * time.Millisecond, ActivityPoll: 10 * time.Millisecond,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 80 * time.Millisecond, KafkaWake: kafkaWake}
}

// startRig runs a Supervisor on f in dir until the test ends (or r.end).
func startRig(t *testing.T, f *fake, dir string, mod func(*Options)) *rig {
	t.Helper()
	r := &rig{t: t, f: f, rec: &recorder{}, dir: dir, log: &syncBuf{}}
	o := testOptions(dir)
	o.Logger = slog.New(slog.NewJSONHandler(r.log, nil))
	o.Observer = r.rec
	if mod != nil {
		mod(&o)
	}
	s, err := newSupervisor(context.Background(), o, f)
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.done = done
	go func() { r.err = s.Run(ctx); close(done) }()
	var once sync.Once
	r.end = func() {
		once.Do(func() {
			cancel()
			<-done
			if r.err != nil && !r.errWanted {
				t.Errorf("Run: %v", r.err)
			}
		})
	}
	t.Cleanup(r.end)
	return r
}

func (r *rig) waitState(want State) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.s.State() != want {
		if time.Now().After(deadline) {
			r.t.Fatalf("state %s, want %s; log:\n%s", r.s.State(), want, r.log.String())
		}
		time.Sleep(2 * time.Millisecond) // finer than wait's 10 ms: a 20 ms backoff state must be seen
	}
}

func imagesIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), imagePrefix) || strings.HasPrefix(e.Name(), badPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Three idle → checkpoint → wake → restore cycles: each new image replaces
// the old one, each restore is of the newest image, the service is
// started cold once.
func TestCycles(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), nil)
	for i := 1; i <= 3; i++ {
		r.waitState(StateStandby)
		want := imageName(i)
		if got := imagesIn(t, r.dir); len(got) != 1 || got[0] != want {
			t.Fatalf("cycle %d: images %v, want [%s]", i, got, want)
		}
		st, err := r.s.dir.readState()
		if err != nil || st.State != StateStandby || st.Image != want {
			t.Fatalf("cycle %d: state file %+v, %v", i, st, err)
		}
		if !r.s.Wake("manual") {
			t.Fatal("Wake of a checkpointed service returned false")
		}
		r.waitState(StateRunning)
	}
	starts, restores, _ := f.snapshot()
	if starts != 1 || strings.Join(restores, ",") != "img-000001,img-000002,img-000003" {
		t.Fatalf("%d cold starts, restores %v; want 1 and the images in order", starts, restores)
	}
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	if len(r.rec.wakes) != 3 {
		t.Errorf("observer saw %d wakes, want 3", len(r.rec.wakes))
	}
	if !strings.Contains(r.log.String(), `"wake_latency_ms"`) {
		t.Errorf("no wake latency in the log:\n%s", r.log.String())
	}
}

// Activity (a changing counter, or an open connection) keeps the service
// running; once it stops, the service sleeps after Idle.
func TestActivityKeepsAwake(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), nil)
	r.waitState(StateRunning)
	pid := r.s.Status().PID
	for range 30 { // 300 ms of work, twice Idle
		f.touch(pid)
		time.Sleep(10 * time.Millisecond)
	}
	if st := r.s.State(); st != StateRunning {
		t.Fatalf("busy service: state %s", st)
	}
	f.mu.Lock()
	f.open[pid] = 1
	f.mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	if st := r.s.State(); st != StateRunning {
		t.Fatalf("service with an open connection: state %s", st)
	}
	f.mu.Lock()
	f.open[pid] = 0
	f.mu.Unlock()
	r.waitState(StateStandby)
}

// A checkpoint the hooks refuse leaves the service running; the next
// idle period tries again.
func TestCheckpointRefused(t *testing.T) {
	f := newFake()
	f.refuse = 1
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), nil)
	r.waitState(StateStandby)
	starts, _, cps := f.snapshot()
	if starts != 1 || len(cps) != 1 {
		t.Fatalf("%d starts, checkpoints %v; want 1 start and 1 checkpoint after 1 refusal", starts, cps)
	}
	if !strings.Contains(r.log.String(), "checkpoint refused or failed") {
		t.Errorf("refusal not logged:\n%s", r.log.String())
	}
}

// A failed restore sets the image aside (kept for inspection) and starts
// the service cold.
func TestRestoreFailsColdStart(t *testing.T) {
	f := newFake()
	f.failRestore[imageName(1)] = true
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), nil)
	r.waitState(StateStandby)
	r.s.Wake("manual")
	if !wait.Until(5*time.Second, func() bool { starts, _, _ := f.snapshot(); return starts == 2 }) {
		t.Fatalf("no cold start after the failed restore; log:\n%s", r.log.String())
	}
	// The next image is numbered past the bad one, which stays.
	r.waitState(StateStandby)
	if st := r.s.Status(); st.Image != imageName(2) {
		t.Fatalf("image after the cold start %q, want %s", st.Image, imageName(2))
	}
	r.end()
	got := imagesIn(t, r.dir)
	bad := false
	for _, n := range got {
		bad = bad || strings.HasPrefix(n, badPrefix+imageName(1)+"-")
	}
	if !bad {
		t.Fatalf("images %v: the bad image was not kept aside", got)
	}
	if !strings.Contains(r.log.String(), "restore failed; starting the service cold") || !strings.Contains(r.log.String(), "bad image") {
		t.Errorf("the failure and its cause are not logged:\n%s", r.log.String())
	}
}

// A service that exits by itself is restarted cold after a backoff that
// grows with every crash in a row.
func TestCrashBackoff(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.Idle = time.Hour })
	for i := 1; i <= 3; i++ {
		r.waitState(StateRunning)
		f.kill(r.s.Status().PID)
		r.waitState(StateBackoff)
	}
	r.waitState(StateRunning)
	starts, _, _ := f.snapshot()
	if starts != 4 {
		t.Fatalf("%d starts after 3 crashes, want 4", starts)
	}
	for _, want := range []string{`"wait_ms":20`, `"wait_ms":40`, `"wait_ms":80`} {
		if !strings.Contains(r.log.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, r.log.String())
		}
	}
}

func TestBackoff(t *testing.T) {
	lo, hi := 500*time.Millisecond, 3*time.Second
	for n, want := range map[int]time.Duration{0: lo, 1: lo, 2: time.Second, 3: 2 * time.Second, 4: hi, 50: hi} {
		if got := backoff(lo, hi, n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// A supervisor stopped while the service sleeps leaves the image; a new one
// on the same directory waits for a wake and restores it, without a cold
// start.
func TestResumeFromKeptImage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	f := newFake()
	r := startRig(t, f, dir, nil)
	r.waitState(StateStandby)
	r.end()
	f2 := newFake()
	r2 := startRig(t, f2, dir, nil)
	r2.waitState(StateStandby)
	time.Sleep(50 * time.Millisecond)
	if starts, _, _ := f2.snapshot(); starts != 0 {
		t.Fatalf("the new supervisor started the service cold (%d starts)", starts)
	}
	r2.s.Wake("manual")
	r2.waitState(StateRunning)
	if starts, restores, _ := f2.snapshot(); starts != 0 || len(restores) != 1 || restores[0] != imageName(1) {
		t.Fatalf("starts %d, restores %v; want 0 and [%s]", starts, restores, imageName(1))
	}
}

// A supervisor stopped while the service runs leaves it running; a new one
// adopts it instead of starting another.
func TestAdoptRunning(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pid, start, err := procfs.Self() // this test process plays the service
	if err != nil {
		t.Fatal(err)
	}
	if err := d.writeState(persisted{State: StateRunning, PID: pid, Start: start}); err != nil {
		t.Fatal(err)
	}
	d.close()
	f := newFake()
	f.live[pid] = true
	f.count[pid] = 1
	r := startRig(t, f, dir, func(o *Options) { o.Idle = time.Hour })
	r.waitState(StateRunning)
	time.Sleep(50 * time.Millisecond)
	if starts, _, _ := f.snapshot(); starts != 0 || r.s.Status().PID != pid {
		t.Fatalf("starts %d, pid %d; want the running service (PID %d) adopted", starts, r.s.Status().PID, pid)
	}
}

// The control socket: status, sleep, wake; and it is 0600.
func TestControlSocket(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.Idle = time.Hour })
	r.waitState(StateRunning)
	fi, err := os.Lstat(r.s.ControlSocket())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v, mode %v; want 0600", err, fi.Mode())
	}
	ctx := context.Background()
	rep, err := Control(ctx, r.dir, "status")
	if err != nil || rep.Status.State != StateRunning || rep.Status.PID == 0 {
		t.Fatalf("status: %+v, %v", rep, err)
	}
	if _, err := Control(ctx, r.dir, "wake"); err == nil || !strings.Contains(err.Error(), "not checkpointed") {
		t.Fatalf("wake of a running service: %v", err)
	}
	if _, err := Control(ctx, r.dir, "sleep"); err != nil {
		t.Fatal(err)
	}
	r.waitState(StateStandby)
	if _, err := Control(ctx, r.dir, "wake"); err != nil {
		t.Fatal(err)
	}
	r.waitState(StateRunning)
	if _, err := Control(ctx, r.dir, "bogus"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("bogus command: %v", err)
	}
}

// Bad input fails in New with one line, before anything starts.
func TestBadInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other := filepath.Join(t.TempDir(), "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	worldWritable := filepath.Join(t.TempDir(), "ww")
	os.Mkdir(worldWritable, 0o700)
	os.Chmod(worldWritable, 0o777)
	cases := []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"no command", func(o *Options) { o.Args = nil }, "no command given"},
		{"zero idle", func(o *Options) { o.Idle = 0 }, "--idle 0s"},
		{"negative idle", func(o *Options) { o.Idle = -time.Second }, "--idle -1s"},
		{"missing program", func(o *Options) { o.Args = []string{"/nonexistent/prog"} }, `command "/nonexistent/prog"`},
		{"listen in use", func(o *Options) { o.Listen = ln.Addr().String() }, "--listen " + ln.Addr().String()},
		{"broker unreachable", func(o *Options) {
			o.Brokers, o.Group, o.BrokerTimeout = []string{"127.0.0.1:1"}, "g", 500*time.Millisecond
		}, "no broker answered"},
		{"image dir writable by others", func(o *Options) { o.ImageDir = worldWritable }, "writable by group or others"},
	}
	if os.Geteuid() == 0 {
		cases = append(cases, struct {
			name string
			mod  func(*Options)
			want string
		}{"image dir of another uid", func(o *Options) { o.ImageDir = other }, "belongs to uid 65534"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			o := testOptions(filepath.Join(t.TempDir(), "img"))
			o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			c.mod(&o)
			s, err := newSupervisor(context.Background(), o, f)
			if err == nil {
				s.close()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line containing %q", err, c.want)
			}
			if starts, _, _ := f.snapshot(); starts != 0 {
				t.Fatal("the service was started")
			}
		})
	}
	// One supervisor per directory.
	dir := filepath.Join(t.TempDir(), "img")
	r := startRig(t, newFake(), dir, nil)
	r.waitState(StateRunning)
	o := testOptions(dir)
	if _, err := newSupervisor(context.Background(), o, newFake()); err == nil || !strings.Contains(err.Error(), "in use by another kcr standby") {
		t.Fatalf("second supervisor on one directory: %v", err)
	}
}

// A wake during a slow checkpoint abandons it: the same copy runs on (no
// restore, no cold start), no image is left, and it is no failure (the
// next idle period checkpoints it).
func TestWakeAbandonsCheckpoint(t *testing.T) {
	f := newFake()
	f.ckptDelay = time.Minute
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), nil)
	r.waitState(StateRunning)
	pid := r.s.Status().PID
	r.waitState(StateCheckpointing)
	t0 := time.Now()
	if !r.s.Wake("manual") {
		t.Fatal("Wake during a checkpoint returned false")
	}
	r.waitState(StateRunning)
	if d := time.Since(t0); d > 30*time.Second {
		t.Fatalf("the wake waited %v for the checkpoint", d)
	}
	if got := r.s.Status().PID; got != pid {
		t.Errorf("running PID %d after the wake, want the same copy %d", got, pid)
	}
	starts, restores, cps := f.snapshot()
	if starts != 1 || len(restores) != 0 || len(cps) != 0 {
		t.Errorf("%d starts, restores %v, checkpoints %v; want 1 start and neither", starts, restores, cps)
	}
	if imgs := imagesIn(t, r.dir); len(imgs) != 0 {
		t.Errorf("images %v after an abandoned checkpoint", imgs)
	}
	if log := r.log.String(); !strings.Contains(log, "checkpoint abandoned for a wake") || strings.Contains(log, "checkpoint refused or failed") {
		t.Errorf("log:\n%s", log)
	}
	r.s.mu.Lock()
	fails := r.s.ckptFails
	r.s.mu.Unlock()
	if fails != 0 {
		t.Errorf("an abandoned checkpoint counted as %d failures", fails)
	}
	// Slow no more: the next idle period checkpoints it.
	f.mu.Lock()
	f.ckptDelay = 0
	f.mu.Unlock()
	r.waitState(StateStandby)
}
