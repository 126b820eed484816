package notify_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// helperEnv selects a helper mode of the test binary, for tests that need a
// client in another process (and with another uid).
const helperEnv = "KCR_NOTIFY_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "hello":
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := client.Hello(ctx, os.Getenv("KCR_NOTIFY_TEST_SOCK"))
		if err != nil {
			fmt.Println("ERR " + err.Error())
			os.Exit(0)
		}
		fmt.Println("OK " + info.Type)
		os.Exit(0)
	case "checkpoint":
		// A stand-in for kcr: asks for a checkpoint, says so, and waits to
		// be killed.
		m, err := client.Checkpoint(context.Background(), os.Getenv("KCR_NOTIFY_TEST_SOCK"),
			client.CheckpointRequest{HookBudget: 30 * time.Second, ResumeAfter: 2 * time.Minute})
		fmt.Println("ANSWER", m.Type, err)
		select {}
	case "nofd":
		nofdHelper()
	case "app":
		// An app (started in a PID namespace of its own): serves its
		// control socket and prints each after-restore event.
		g := notify.NewRegistry()
		g.Register("probe", notify.Func(nil, func(_ context.Context, ev notify.Event) error {
			fmt.Printf("AFTER %s %q\n", ev.Kind, ev.Reason)
			return nil
		}))
		if _, err := g.Start(notify.WithSocketPath(os.Getenv("KCR_NOTIFY_TEST_SOCK"))); err != nil {
			fmt.Println("ERR " + err.Error())
			os.Exit(1)
		}
		fmt.Println("READY", os.Getpid())
		select {}
	default:
		fmt.Fprintln(os.Stderr, "unknown helper mode")
		os.Exit(2)
	}
}

// syncBuffer is a log sink safe for concurrent use; waitFor lets a test
// wait for a line without polling.
type syncBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	grew chan struct{} // closed by the next Write, made by a waiter
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grew != nil {
		close(s.grew)
		s.grew = nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// waitFor waits up to d until what was written after the first from bytes
// holds substr, and tells whether it did.
func (s *syncBuffer) waitFor(from int, substr string, d time.Duration) bool {
	timeout := time.After(d)
	for {
		s.mu.Lock()
		if strings.Contains(s.b.String()[from:], substr) {
			s.mu.Unlock()
			return true
		}
		if s.grew == nil {
			s.grew = make(chan struct{})
		}
		grew := s.grew
		s.mu.Unlock()
		select {
		case <-grew:
		case <-timeout:
			return false
		}
	}
}

type fixture struct {
	t    *testing.T
	g    *notify.Registry
	s    *notify.Server
	path string
	log  *syncBuffer
	rec  *recorder
	// afterEv receives every event an after hook of the "probe" resource
	// sees.
	afterEv chan notify.Event
}

// newFixture starts a server on a fresh registry with three recorded
// resources (a, b, probe) in t.TempDir().
func newFixture(t *testing.T, opts ...notify.Opt) *fixture {
	t.Helper()
	f := &fixture{t: t, g: notify.NewRegistry(), log: &syncBuffer{}, rec: newRecorder(), afterEv: make(chan notify.Event, 16)}
	f.g.Register("a", f.rec.res("a", nil, nil))
	f.g.Register("b", f.rec.res("b", nil, nil))
	f.g.Register("probe", notify.Func(func(ctx context.Context) error {
		f.rec.add("before:probe")
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		f.rec.add("after:probe")
		f.afterEv <- ev
		return nil
	}))
	f.path = filepath.Join(t.TempDir(), "kcr-test.sock")
	f.start(opts...)
	return f
}

func (f *fixture) start(opts ...notify.Opt) {
	f.t.Helper()
	logger := slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts = append([]notify.Opt{notify.WithSocketPath(f.path), notify.WithLogger(logger)}, opts...)
	s, err := f.g.Start(opts...)
	if err != nil {
		f.t.Fatalf("Start: %v", err)
	}
	f.s = s
	f.t.Cleanup(func() {
		done := make(chan struct{})
		go func() { s.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			panic("Server.Close hangs")
		}
	})
}

func (f *fixture) checkpoint(req client.CheckpointRequest) proto.Message {
	f.t.Helper()
	m, err := client.Checkpoint(ctx(f.t), f.path, req)
	if err != nil {
		f.t.Fatalf("Checkpoint: %v", err)
	}
	if m.Type != proto.TypeReady {
		f.t.Fatalf("Checkpoint answered %+v", m)
	}
	return m
}

// waitAfter waits for the probe's after-restore event.
func (f *fixture) waitAfter(within time.Duration) notify.Event {
	f.t.Helper()
	select {
	case ev := <-f.afterEv:
		return ev
	case <-time.After(within):
		f.t.Fatalf("no after-restore hook within %v; log:\n%s", within, f.log)
		return notify.Event{}
	}
}

func (f *fixture) noAfter(within time.Duration) {
	f.t.Helper()
	select {
	case ev := <-f.afterEv:
		f.t.Fatalf("unexpected after-restore event %+v", ev)
	case <-time.After(within):
	}
}

func (f *fixture) state() string {
	f.t.Helper()
	m, err := client.Hello(ctx(f.t), f.path)
	if err != nil {
		f.t.Fatalf("Hello: %v", err)
	}
	return m.State
}

// waitLog waits until the server has logged a line holding substr.
func (f *fixture) waitLog(substr string) {
	f.t.Helper()
	if !f.log.waitFor(0, substr, 5*time.Second) {
		f.t.Fatalf("never logged %q; log:\n%s", substr, f.log)
	}
}

// waitIdle waits until the cycle is over: the server is idle, or logs that
// it went idle after this call began.
func (f *fixture) waitIdle() {
	f.t.Helper()
	mark := f.log.Len()
	if f.state() == "idle" {
		return
	}
	if !f.log.waitFor(mark, "state=idle", 3*time.Second) {
		f.t.Fatalf("server never went back to idle; log:\n%s", f.log)
	}
}

// dial opens a connection to the server, closed at the end of the test.
func (f *fixture) dial() net.Conn {
	f.t.Helper()
	c, err := net.Dial("unix", f.path)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	return c
}

// slowHook registers a resource "slow" whose before hook signals entered
// and then waits for release.
func (f *fixture) slowHook() (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.g.Register("slow", notify.Func(func(ctx context.Context) error {
		once.Do(func() { close(in) })
		<-out
		return nil
	}, nil))
	return in, sync.OnceFunc(func() { close(out) })
}

// checkpointAsync sends a checkpoint request from a goroutine; its error
// comes on the channel.
func (f *fixture) checkpointAsync(req client.CheckpointRequest) <-chan error {
	res := make(chan error, 1)
	go func() {
		_, err := client.Checkpoint(context.Background(), f.path, req)
		res <- err
	}()
	return res
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// fakeStart is a start-time source a test can change, to fake a restore.
type fakeStart struct {
	v    atomic.Uint64
	once sync.Once
	seen chan struct{} // closed when the server first reads a changed start time
}

func newFakeStart() *fakeStart {
	f := &fakeStart{seen: make(chan struct{})}
	f.v.Store(1000)
	return f
}

func (f *fakeStart) read(int) (uint64, error) {
	v := f.v.Load()
	if v != 1000 {
		f.once.Do(func() { close(f.seen) })
	}
	return v, nil
}

func (f *fakeStart) restore() { f.v.Add(1) }

// waitSeen waits until the server has read the start time changed by
// restore: from then on it knows it was restored.
func (f *fakeStart) waitSeen(t *testing.T) {
	t.Helper()
	select {
	case <-f.seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the server never read the restored start time")
	}
}

func TestHelloInfo(t *testing.T) {
	f := newFixture(t)
	m, err := client.Hello(ctx(t), f.path)
	if err != nil {
		t.Fatal(err)
	}
	gen, id := f.g.Identity()
	if m.Type != proto.TypeInfo || m.PID != os.Getpid() || m.State != "idle" || m.InstanceID != id || m.AppGeneration != gen {
		t.Fatalf("info = %+v", m)
	}
	if !slices.Equal(m.Resources, []string{"a", "b", "probe"}) {
		t.Errorf("resources = %v", m.Resources)
	}
	if m.StartTime == 0 {
		t.Error("no start time")
	}
	if f.s.Path() != f.path {
		t.Errorf("Path() = %q", f.s.Path())
	}
}

func TestCheckpointResume(t *testing.T) {
	f := newFixture(t)
	_, id0 := f.g.Identity()
	m := f.checkpoint(client.CheckpointRequest{HookBudget: 2 * time.Second, ResumeAfter: 10 * time.Second})
	if got := names(m.Reports); !slices.Equal(got, []string{"probe", "b", "a"}) {
		t.Errorf("ready reports = %v", got)
	}
	if m.PID != os.Getpid() || m.StartTime == 0 {
		t.Errorf("ready = %+v", m)
	}
	if st := f.state(); st != "waiting" {
		t.Errorf("state while waiting = %q", st)
	}
	f.noAfter(50 * time.Millisecond)

	done, err := client.Resume(ctx(t), f.path, "leave-running", 5*time.Second)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if done.Type != proto.TypeDone || done.Kind != proto.KindResume || done.State != "resume" || done.InstanceID != id0 || done.AppGeneration != 0 {
		t.Errorf("done = %+v", done)
	}
	if got := names(done.Reports); !slices.Equal(got, []string{"a", "b", "probe"}) {
		t.Errorf("done reports = %v", got)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Resume || ev.Reason != "leave-running" || ev.InstanceID != id0 || ev.SelfDetected {
		t.Errorf("event = %+v", ev)
	}
	f.rec.wantCalls(t, "calls", []string{"before:probe", "before:b", "before:a", "after:a", "after:b", "after:probe"})
	if st := f.state(); st != "idle" {
		t.Errorf("state after the cycle = %q", st)
	}
	// A second follow-up finds nothing waiting.
	if _, err := client.Resume(ctx(t), f.path, "again", time.Second); err == nil || !strings.Contains(err.Error(), "no checkpoint is waiting") {
		t.Errorf("second Resume: %v", err)
	}
}

// TestRawProtocolReadyThenEOF checks on the wire that the app closes the
// checkpoint connection right after "ready", and takes the follow-up on a
// new connection.
func TestRawProtocolReadyThenEOF(t *testing.T) {
	f := newFixture(t)
	c := f.dial()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := proto.Write(c, proto.Message{Type: proto.TypeCheckpoint, HookBudget: time.Second, ResumeAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	m, err := proto.Read(c)
	if err != nil || m.Type != proto.TypeReady {
		t.Fatalf("ready: %+v, %v", m, err)
	}
	var b [1]byte
	if n, err := c.Read(b[:]); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after ready: read %d, %v; want EOF", n, err)
	}
	if _, err := client.Resume(ctx(t), f.path, "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ev := f.waitAfter(time.Second); ev.Kind != notify.Resume || ev.Reason != "resumed" {
		t.Errorf("event = %+v", ev)
	}
}

func TestCheckpointRestored(t *testing.T) {
	f := newFixture(t)
	_, id0 := f.g.Identity()
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	done, err := client.Restored(ctx(t), f.path, 7, 5*time.Second)
	if err != nil {
		t.Fatalf("Restored: %v", err)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Restore || ev.Generation != 7 || ev.InstanceID == id0 || !hexID.MatchString(ev.InstanceID) || ev.SelfDetected {
		t.Errorf("event = %+v (old id %s)", ev, id0)
	}
	if done.Kind != proto.KindRestore || done.AppGeneration != 7 || done.InstanceID != ev.InstanceID {
		t.Errorf("done = %+v", done)
	}
	if gen, id := f.g.Identity(); gen != 7 || id != ev.InstanceID {
		t.Errorf("identity = %d %s", gen, id)
	}
	info, err := client.Hello(ctx(t), f.path)
	if err != nil || info.AppGeneration != 7 || info.InstanceID != ev.InstanceID {
		t.Errorf("info after restore = %+v, %v", info, err)
	}
	// Restored without a generation: previous + 1.
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	if _, err := client.Restored(ctx(t), f.path, 0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ev2 := f.waitAfter(time.Second); ev2.Generation != 8 || ev2.InstanceID == ev.InstanceID {
		t.Errorf("second restore event = %+v", ev2)
	}
}

func TestCheckpointHookFailure(t *testing.T) {
	f := newFixture(t)
	f.g.Register("broken", f.rec.res("broken", errors.New("cannot close"), nil))
	_, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	var hf *proto.HookFailure
	if !errors.As(err, &hf) {
		t.Fatalf("Checkpoint err = %v, want *proto.HookFailure", err)
	}
	if !strings.Contains(hf.Msg, `"broken"`) || !strings.Contains(hf.Msg, "cannot close") || !strings.Contains(err.Error(), "nothing was dumped") {
		t.Errorf("failure message %q", err)
	}
	var failed []string
	for _, r := range hf.Reports {
		if r.Error != "" {
			failed = append(failed, r.Name)
		}
	}
	if !slices.Equal(failed, []string{"broken"}) {
		t.Errorf("failed reports = %v (%+v)", failed, hf.Reports)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Resume || !strings.Contains(ev.Reason, "checkpoint failed") {
		t.Errorf("event = %+v", ev)
	}
	want := []string{"before:broken", "before:probe", "before:b", "before:a", "after:a", "after:b", "after:probe", "after:broken"}
	f.rec.wantCalls(t, "calls", want)
	if ev := f.rec.eventsOf("broken"); len(ev) != 1 || ev[0].Kind != notify.Resume {
		t.Errorf("failing resource's events = %+v", ev)
	}
	if st := f.state(); st != "idle" {
		t.Errorf("state = %q", st)
	}
}

func TestCheckpointBusy(t *testing.T) {
	f := newFixture(t)
	entered, release := f.slowHook()
	first := f.checkpointAsync(client.CheckpointRequest{HookBudget: 5 * time.Second, ResumeAfter: 10 * time.Second})
	<-entered
	if st := f.state(); st != "checkpointing" {
		t.Errorf("state during hooks = %q", st)
	}
	_, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: time.Second})
	if !errors.Is(err, notify.ErrBusy) {
		t.Fatalf("second Checkpoint: %v, want ErrBusy", err)
	}
	if _, err := f.g.Simulate(context.Background(), notify.SimResume, time.Second); !errors.Is(err, notify.ErrBusy) {
		t.Fatalf("Simulate during a checkpoint: %v", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatalf("first Checkpoint: %v", err)
	}
	// Still busy while waiting for the follow-up.
	if _, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: time.Second}); !errors.Is(err, notify.ErrBusy) {
		t.Fatalf("Checkpoint while waiting: %v, want ErrBusy", err)
	}
	if _, err := client.Resume(ctx(t), f.path, "done", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	f.waitAfter(time.Second)
}

func TestResumeOnOwnAfterDeadline(t *testing.T) {
	f := newFixture(t)
	start := time.Now()
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 300 * time.Millisecond})
	ev := f.waitAfter(3 * time.Second)
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Errorf("resumed after %v, before ResumeAfter", el)
	}
	if ev.Kind != notify.Resume || ev.Reason != "no follow-up from kcr within 300ms" || ev.SelfDetected {
		t.Errorf("event = %+v", ev)
	}
	if !strings.Contains(f.log.String(), "no follow-up from kcr") {
		t.Errorf("not logged:\n%s", f.log)
	}
	// The CLI coming back late is told so.
	if _, err := client.Resume(ctx(t), f.path, "late", time.Second); err == nil || !strings.Contains(err.Error(), "no checkpoint is waiting") {
		t.Errorf("late Resume: %v", err)
	}
}

func TestMaxSuspendCapsResumeAfter(t *testing.T) {
	f := newFixture(t, notify.WithMaxSuspend(300*time.Millisecond))
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: time.Hour})
	ev := f.waitAfter(3 * time.Second)
	if ev.Kind != notify.Resume || ev.Reason != "no follow-up from kcr within 300ms" {
		t.Errorf("event = %+v", ev)
	}
}

func TestSelfDetectedRestore(t *testing.T) {
	st := newFakeStart()
	const grace = 200 * time.Millisecond
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(10*time.Millisecond), notify.WithRestoreGrace(grace))
	gen0, id0 := f.g.Identity()
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	f.noAfter(50 * time.Millisecond)
	restoredAt := time.Now()
	st.restore()
	ev := f.waitAfter(3 * time.Second)
	if el := time.Since(restoredAt); el < grace {
		t.Errorf("hooks ran %v after the restore, before the grace of %v", el, grace)
	}
	if ev.Kind != notify.Restore || !ev.SelfDetected || ev.Generation != gen0+1 || ev.InstanceID == id0 || !strings.Contains(ev.Reason, "did not arrive") {
		t.Errorf("event = %+v", ev)
	}
	if _, err := client.Restored(ctx(t), f.path, 5, time.Second); err == nil {
		t.Error("Restored after self-detection was accepted")
	}
}

func TestSelfDetectedRestoreThenLateMessage(t *testing.T) {
	st := newFakeStart()
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(10*time.Millisecond), notify.WithRestoreGrace(3*time.Second))
	_, id0 := f.g.Identity()
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	st.restore()
	st.waitSeen(t) // by the poll: the grace runs
	f.noAfter(0)
	done, err := client.Restored(ctx(t), f.path, 7, 5*time.Second)
	if err != nil {
		t.Fatalf("Restored within the grace: %v", err)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Restore || ev.Generation != 7 || ev.SelfDetected || ev.InstanceID == id0 || done.AppGeneration != 7 {
		t.Errorf("event = %+v, done = %+v", ev, done)
	}
}

// TestRestoreDetectedByDeadline: after a restore, the monotonic clock may be
// far ahead of the dumped one, so the ResumeAfter timer fires at once. The
// app must still wait the grace for kcr's message and its generation.
func TestRestoreDetectedByDeadline(t *testing.T) {
	st := newFakeStart()
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(time.Hour), notify.WithRestoreGrace(3*time.Second))
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 100 * time.Millisecond})
	st.restore()
	st.waitSeen(t) // when the deadline fired (the poll is an hour away)
	f.noAfter(0)
	if _, err := client.Restored(ctx(t), f.path, 9, 5*time.Second); err != nil {
		t.Fatalf("Restored: %v", err)
	}
	if ev := f.waitAfter(time.Second); ev.Kind != notify.Restore || ev.Generation != 9 || ev.SelfDetected {
		t.Errorf("event = %+v", ev)
	}
}

// TestResumeToRestoredCopy: the start time is the ground truth; a "resume"
// that reaches a restored copy still makes it a new instance.
func TestResumeToRestoredCopy(t *testing.T) {
	st := newFakeStart()
	f := newFixture(t, notify.WithInstanceFunc(st.read), notify.WithPollEvery(time.Hour))
	_, id0 := f.g.Identity()
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	st.restore()
	done, err := client.Resume(ctx(t), f.path, "leave-running", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Restore || ev.Generation != 1 || ev.InstanceID == id0 || done.Kind != proto.KindRestore {
		t.Errorf("event = %+v, done = %+v", ev, done)
	}
}

func TestCloseDuringWaitingResumes(t *testing.T) {
	f := newFixture(t)
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: time.Minute})
	start := time.Now()
	if err := f.s.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Close took %v", el)
	}
	ev := f.waitAfter(time.Second)
	if ev.Kind != notify.Resume || !strings.Contains(ev.Reason, "closed") {
		t.Errorf("event = %+v", ev)
	}
	if _, err := os.Lstat(f.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Close: %v", err)
	}
	if err := f.s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestCloseDuringBeforeHooks: the app must not answer "ready" (and get
// dumped) when it is closing and about to resume.
func TestCloseDuringBeforeHooks(t *testing.T) {
	f := newFixture(t)
	entered, release := f.slowHook()
	res := f.checkpointAsync(client.CheckpointRequest{HookBudget: 5 * time.Second, ResumeAfter: time.Minute})
	<-entered
	closed := make(chan struct{})
	go func() { f.s.Close(); close(closed) }()
	// Close has begun once it has closed the listener, which unlinks the
	// socket.
	wait.For(t, 5*time.Second, "Close to remove the socket", func() bool {
		_, err := os.Lstat(f.path)
		return errors.Is(err, os.ErrNotExist)
	})
	release()
	<-closed
	if err := <-res; err == nil || !strings.Contains(err.Error(), "closed during the before-checkpoint hooks") {
		t.Fatalf("Checkpoint while closing: %v", err)
	}
	if ev := f.waitAfter(time.Second); ev.Kind != notify.Resume {
		t.Errorf("event = %+v", ev)
	}
}

// TestCloseWithSilentClient: a client that connects and sends nothing must
// not hold Close up.
func TestCloseWithSilentClient(t *testing.T) {
	f := newFixture(t)
	f.dial()
	// Connections are accepted in order: once a later one is answered, c
	// has been accepted too.
	f.state()
	start := time.Now()
	f.s.Close()
	if el := time.Since(start); el > time.Second {
		t.Errorf("Close took %v with an idle client", el)
	}
}

func TestSocketModeAndRemoval(t *testing.T) {
	f := newFixture(t)
	fi, err := os.Lstat(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want a socket with 0600", fi.Mode())
	}
	f.s.Close()
	if _, err := os.Lstat(f.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket not removed: %v", err)
	}
}

func TestSocketDirAndName(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sub", "kcr")
	s, err := notify.NewRegistry().Start(notify.WithSocketDir(dir), notify.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if want := filepath.Join(dir, "kcr-"+strconv.Itoa(os.Getpid())+".sock"); s.Path() != want {
		t.Errorf("Path = %q, want %q", s.Path(), want)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket dir: %v, %v", fi.Mode(), err)
	}
	for _, bad := range []string{"x.sock", "kcr-.sock", "kcr-x.socket", "kcr-x", "app.sock"} {
		if _, err := notify.NewRegistry().Start(notify.WithSocketPath(filepath.Join(dir, bad))); err == nil || !strings.Contains(err.Error(), "kcr-NAME.sock") {
			t.Errorf("socket name %q: err = %v", bad, err)
		}
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kcr-stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // a dead process's socket file stays
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
	s, err := notify.NewRegistry().Start(notify.WithSocketPath(path), notify.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("Start over a stale socket: %v", err)
	}
	defer s.Close()
	if _, err := client.Hello(ctx(t), path); err != nil {
		t.Fatal(err)
	}
}

func TestLiveSocketKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kcr-live.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = notify.NewRegistry().Start(notify.WithSocketPath(path), notify.WithLogger(slog.New(slog.DiscardHandler)))
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("Start over a live socket: %v", err)
	}
	// The other listener still works.
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("live socket was removed: %v", err)
	}
	c.Close()

	// Also a second server of the same kind on the same path.
	f := newFixture(t)
	if _, err := notify.NewRegistry().Start(notify.WithSocketPath(f.path)); err == nil {
		t.Fatal("second server on a served path started")
	}
	if _, err := client.Hello(ctx(t), f.path); err != nil {
		t.Fatalf("first server lost its socket: %v", err)
	}
}

// TestLiveSocketWithFullBacklog: a live server whose backlog is full answers
// connect with EAGAIN, not ECONNREFUSED; its socket must not be taken for a
// stale one.
func TestLiveSocketWithFullBacklog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kcr-full.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	// Fill the backlog: nothing accepts.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 4 {
		c, err := net.DialTimeout("unix", path, 100*time.Millisecond)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	if _, err := net.DialTimeout("unix", path, 100*time.Millisecond); err == nil || errors.Is(err, syscall.ECONNREFUSED) {
		t.Skipf("could not fill the backlog: %v", err)
	}
	_, err = notify.NewRegistry().Start(notify.WithSocketPath(path), notify.WithLogger(slog.New(slog.DiscardHandler)))
	if err == nil {
		t.Fatal("Start took over a live socket with a full backlog")
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("live socket removed: %v", err)
	}
}

func rawCall(t *testing.T, path string, frame []byte) proto.Message {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	m, err := proto.Read(c)
	if err != nil {
		t.Fatalf("no answer to %q: %v", frame, err)
	}
	return m
}

func frameOf(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func TestMalformedFrames(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"garbage json", frameOf("{not json"), "malformed"},
		{"wrong version", frameOf(`{"v":99,"type":"hello"}`), "version"},
		{"unknown type", frameOf(`{"v":1,"type":"explode"}`), "unknown type"},
		{"negative duration", frameOf(`{"v":1,"type":"checkpoint","hook_budget_ns":-5}`), "negative"},
		{"too large", binary.BigEndian.AppendUint32(nil, proto.MaxFrame+1), "too large"},
		{"app-side type", frameOf(`{"v":1,"type":"info"}`), "unexpected message type"},
		{"truncated body", append(binary.BigEndian.AppendUint32(nil, 100), `{"v":1`...), "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frame := tc.frame
			c := f.dial()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(frame); err != nil {
				t.Fatal(err)
			}
			if tc.name == "truncated body" {
				c.(*net.UnixConn).CloseWrite()
			}
			m, err := proto.Read(c)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if m.Type != proto.TypeError || !strings.Contains(m.Error, tc.want) {
				t.Errorf("answer = %+v, want an error with %q", m, tc.want)
			}
		})
	}
	// Still serving, and nothing ran.
	if st := f.state(); st != "idle" {
		t.Errorf("state = %q", st)
	}
	if calls := f.rec.take(); len(calls) != 0 {
		t.Errorf("hooks ran: %v", calls)
	}
	// An empty connection gets no answer and no complaint.
	c := f.dial()
	c.Close()
	if m := rawCall(t, f.path, frameOf(`{"v":1,"type":"hello"}`)); m.Type != proto.TypeInfo {
		t.Errorf("hello after bad frames = %+v", m)
	}
}

func TestFollowupWithoutCheckpoint(t *testing.T) {
	f := newFixture(t)
	_, err := client.Restored(ctx(t), f.path, 3, time.Second)
	if err == nil || !strings.Contains(err.Error(), "no checkpoint is waiting for a restored message") {
		t.Fatalf("Restored while idle: %v", err)
	}
	f.noAfter(50 * time.Millisecond)
}

func TestRegisterDuringWaitingIsLateJoiner(t *testing.T) {
	f := newFixture(t)
	f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	f.rec.take()
	f.g.Register("late", f.rec.res("late", nil, nil)) // while the process would be dumped
	done, err := client.Resume(ctx(t), f.path, "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f.waitAfter(time.Second)
	if got := names(done.Reports); slices.Contains(got, "late") {
		t.Errorf("late joiner resumed in the cycle it missed: %v", got)
	}
	if got := f.rec.take(); slices.Contains(got, "after:late") {
		t.Errorf("late joiner's after hook ran: %v", got)
	}
	if !strings.Contains(f.log.String(), "join from the next one") || !strings.Contains(f.log.String(), "late") {
		t.Errorf("late joiner not logged:\n%s", f.log)
	}
	m := f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second})
	if got := names(m.Reports); !slices.Equal(got, []string{"late", "probe", "b", "a"}) {
		t.Errorf("next cycle's before reports = %v", got)
	}
	if _, err := client.Resume(ctx(t), f.path, "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	f.waitAfter(time.Second)
}

// TestCLIGoneBeforeReady: if the CLI has gone when the hooks end, nobody
// will dump the process, which resumes at once rather than after ResumeAfter.
func TestCLIGoneBeforeReady(t *testing.T) {
	f := newFixture(t)
	entered, release := f.slowHook()
	c := f.dial()
	if err := proto.Write(c, proto.Message{Type: proto.TypeCheckpoint, HookBudget: 5 * time.Second, ResumeAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	<-entered
	c.Close()
	f.waitLog("kcr went away while the before-checkpoint hooks ran")
	release()
	ev := f.waitAfter(3 * time.Second)
	if ev.Kind != notify.Resume || !strings.Contains(ev.Reason, "went away") {
		t.Errorf("event = %+v", ev)
	}
}

// TestFollowupRacesDeadline sends the follow-up right when the app gives up
// waiting. Whatever wins, the CLI gets an answer and Close does not hang.
func TestFollowupRacesDeadline(t *testing.T) {
	f := newFixture(t)
	for i := range 25 {
		const resumeAfter = 30 * time.Millisecond
		f.checkpoint(client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: resumeAfter})
		time.Sleep(resumeAfter - 10*time.Millisecond + time.Duration(rand.IntN(20))*time.Millisecond)
		c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := client.Resume(c, f.path, "race", 2*time.Second)
		cancel()
		if err != nil && (errors.Is(err, client.ErrPending) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "app refused")) {
			t.Fatalf("round %d: follow-up left without an answer: %v", i, err)
		}
		f.waitAfter(3 * time.Second)
		f.waitIdle()
	}
}

// TestHugeReportStillAnswered: a report too large for a frame must not cost
// the CLI its answer.
func TestHugeReportStillAnswered(t *testing.T) {
	f := newFixture(t)
	f.g.Register("huge", notify.Func(func(ctx context.Context) error {
		return errors.New(strings.Repeat("x", proto.MaxFrame+10))
	}, nil))
	_, err := client.Checkpoint(ctx(t), f.path, client.CheckpointRequest{HookBudget: time.Second})
	var hf *proto.HookFailure
	if !errors.As(err, &hf) || !strings.Contains(hf.Msg, "truncated") {
		t.Fatalf("Checkpoint: %v", err)
	}
	f.waitAfter(time.Second)
	f.waitIdle()

	// Many resources whose reports add up to more than a frame.
	g := notify.NewRegistry()
	for i := range 3000 {
		g.Register(fmt.Sprintf("r%04d", i), notify.Func(func(ctx context.Context) error {
			return errors.New(strings.Repeat("<", 300))
		}, nil))
	}
	path := filepath.Join(t.TempDir(), "kcr-many.sock")
	s, err := g.Start(notify.WithSocketPath(path), notify.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = client.Checkpoint(ctx(t), path, client.CheckpointRequest{HookBudget: 5 * time.Second})
	if !errors.As(err, &hf) || len(hf.Reports) != proto.MaxEntries {
		t.Fatalf("Checkpoint with 3000 failing resources: %v", err)
	}
	// The before reports, which carry the failures, are all kept.
	failed := 0
	for _, r := range hf.Reports {
		if r.Error != "" {
			failed++
		}
	}
	if failed != 3000 {
		t.Errorf("%d failed reports kept, want 3000", failed)
	}
}

func TestPeerCredentials(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	// A directory everybody can traverse, with a copy of the test binary
	// that uid 65534 can run (go's build dir is private).
	dir, err := os.MkdirTemp("", "kcrpeer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}

	f := &fixture{t: t, g: notify.NewRegistry(), log: &syncBuffer{}, rec: newRecorder(), afterEv: make(chan notify.Event, 1)}
	f.path = filepath.Join(dir, "kcr-peer.sock")
	f.start()

	runAs := func() string {
		t.Helper()
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), helperEnv+"=hello", "KCR_NOTIFY_TEST_SOCK="+f.path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}

	// 0600: the kernel refuses the connect.
	if out := runAs(); !strings.HasPrefix(out, "ERR connect") || !strings.Contains(out, "permission denied") {
		t.Fatalf("other user on the 0600 socket: %q", out)
	}
	// Opened up by mistake: the peer-credential check refuses.
	if err := os.Chmod(f.path, 0o666); err != nil {
		t.Fatal(err)
	}
	out := runAs()
	if !strings.HasPrefix(out, "ERR app refused hello: permission denied") {
		t.Fatalf("other user on a 0666 socket: %q", out)
	}
	logs := f.log.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "refused peer") || !strings.Contains(logs, "peer_uid=65534") {
		t.Errorf("refusal not logged:\n%s", logs)
	}
	// Root still gets in.
	if _, err := client.Hello(ctx(t), f.path); err != nil {
		t.Fatal(err)
	}
}

// startKCR starts a stand-in for kcr in another process that asks for a
// checkpoint and then hangs; the returned function SIGKILLs it.
func startKCR(t *testing.T, sock string) (answered <-chan string, kill func()) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=checkpoint", "KCR_NOTIFY_TEST_SOCK="+sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 1)
	go func() {
		b := make([]byte, 256)
		n, _ := out.Read(b)
		ch <- string(b[:n])
	}()
	kill = func() { cmd.Process.Kill(); cmd.Wait() }
	t.Cleanup(kill)
	return ch, kill
}

// TestKCRKilledWhileWaiting: kcr is SIGKILLed after the app answered ready
// (as if it died before or during the dump). The app resumes within a
// moment, not after the 2-minute resumeAfter it was given.
func TestKCRKilledWhileWaiting(t *testing.T) {
	f := newFixture(t)
	kill := startKCRReady(t, f.path)
	f.noAfter(200 * time.Millisecond) // kcr alive: the app waits
	f.resumesAfterKill(kill, "exited before its follow-up")
}

// TestKCRKilledDuringHooks: kcr dies while a slow hook runs; the hook's
// context is cancelled and every resource resumes at once.
func TestKCRKilledDuringHooks(t *testing.T) {
	f := newFixture(t)
	entered := make(chan struct{})
	var once sync.Once
	f.g.Register("slow", notify.Func(func(ctx context.Context) error {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return context.Cause(ctx)
	}, nil))
	_, kill := startKCR(t, f.path)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("hook not called")
	}
	f.resumesAfterKill(kill, "kcr went away")
}

// resumesAfterKill kills the stand-in kcr and wants every resource resumed
// within a second, for a reason holding reason, and the cycle over.
func (f *fixture) resumesAfterKill(kill func(), reason string) {
	f.t.Helper()
	kill()
	killed := time.Now()
	ev := f.waitAfter(5 * time.Second)
	if d := time.Since(killed); d > time.Second {
		f.t.Errorf("resumed %v after kcr died, want ≤ 1s", d)
	}
	if ev.Kind != notify.Resume || !strings.Contains(ev.Reason, reason) {
		f.t.Errorf("event = %+v, want a resume with reason %q", ev, reason)
	}
	f.waitIdle()
}

// The before-checkpoint hooks see --leave-running (notify.LeaveRunning)
// exactly when kcr asked for it, and so do those of a simulated cycle.
func TestLeaveRunningIntent(t *testing.T) {
	f := newFixture(t)
	seen := make(chan bool, 4)
	f.g.Register("intent", notify.Func(func(ctx context.Context) error {
		seen <- notify.LeaveRunning(ctx)
		return nil
	}, nil))
	for _, leave := range []bool{false, true} {
		f.checkpoint(client.CheckpointRequest{HookBudget: 2 * time.Second, ResumeAfter: 10 * time.Second, LeaveRunning: leave})
		if got := <-seen; got != leave {
			t.Errorf("checkpoint with LeaveRunning %v: the hook saw %v", leave, got)
		}
		if _, err := client.Resume(ctx(t), f.path, "leave-running", 5*time.Second); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		f.waitAfter(time.Second)
		f.rec.take()
	}
	g := notify.NewRegistry()
	g.Register("intent", notify.Func(func(ctx context.Context) error {
		seen <- notify.LeaveRunning(ctx)
		return nil
	}, nil))
	for _, c := range []struct {
		o     notify.SimOutcome
		leave bool
		kind  notify.Kind
	}{{notify.SimResume, false, notify.Resume}, {notify.SimLeaveRunning, true, notify.Resume}, {notify.SimLeaveRunningCopy, true, notify.Restore}} {
		r, err := g.Simulate(context.Background(), c.o, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := <-seen; got != c.leave || r.Event.Kind != c.kind {
			t.Errorf("Simulate(%v): LeaveRunning %v, event %v; want %v, %v", c.o, got, r.Event.Kind, c.leave, c.kind)
		}
	}
}

// TestKCRKilledWhileWaitingOtherPIDNamespace: an app in a PID namespace of
// its own (as under "kcr run") gets PID 0 for kcr from SO_PEERCRED; it
// watches the PID kcr named in its request instead, so it resumes within a
// moment of kcr's death, not after the 2-minute resumeAfter.
func TestKCRKilledWhileWaitingOtherPIDNamespace(t *testing.T) {
	imagetest.NeedRootTo(t, "make a PID namespace")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "kcr-ns.sock")
	app := exec.Command(self)
	app.Env = append(os.Environ(), helperEnv+"=app", "KCR_NOTIFY_TEST_SOCK="+sock)
	app.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out, err := app.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Process.Kill(); app.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(within time.Duration) string {
		t.Helper()
		select {
		case l := <-lines:
			return l
		case <-time.After(within):
			t.Fatalf("app printed nothing within %v", within)
			return ""
		}
	}
	if l := next(10 * time.Second); l != "READY 1" {
		t.Fatalf("app: %q, want READY 1 (init of its own PID namespace)", l)
	}
	kill := startKCRReady(t, sock)
	select {
	case l := <-lines:
		t.Fatalf("app went on while kcr was alive: %q", l)
	case <-time.After(200 * time.Millisecond):
	}
	kill()
	killed := time.Now()
	l := next(5 * time.Second)
	if d := time.Since(killed); d > time.Second {
		t.Errorf("resumed %v after kcr died, want ≤ 1s", d)
	}
	if !strings.HasPrefix(l, "AFTER resume") || !strings.Contains(l, "exited before its follow-up") {
		t.Errorf("app: %q, want a resume because kcr exited", l)
	}
}

// startKCRReady is startKCR, waiting until the app answered ready.
func startKCRReady(t *testing.T, sock string) (kill func()) {
	t.Helper()
	answered, kill := startKCR(t, sock)
	select {
	case a := <-answered:
		if !strings.HasPrefix(a, "ANSWER ready") {
			t.Fatalf("stand-in got %q", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ready")
	}
	return kill
}

// A checkpoint returns the heap's free pages to the kernel before the app
// answers ready, so that they are neither dumped nor restored: 64 MiB of
// garbage (the collector off, so nothing collects it before) is released
// by the time kcr hears ready.
func TestCheckpointFreesHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	f := newFixture(t)
	garbage := make([][]byte, 64)
	for i := range garbage {
		garbage[i] = make([]byte, 1<<20)
		for j := range garbage[i] {
			garbage[i][j] = byte(j) // touched: resident
		}
	}
	released := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := released()
	garbage = nil
	f.checkpoint(client.CheckpointRequest{HookBudget: 2 * time.Second, ResumeAfter: 10 * time.Second})
	if got := released() - min(before, released()); got < 48<<20 {
		t.Errorf("heap released by the checkpoint: %d MiB, want 48 MiB at least of the 64 MiB of garbage", got>>20)
	}
	if _, err := client.Resume(ctx(t), f.path, "leave-running", 5*time.Second); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	f.waitAfter(time.Second)
}
