package criuaction

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/proto"
)

// startApp serves a registry's control socket in this process, which is
// then the "tree" CRIU would dump.
func startApp(t *testing.T, before error) (events chan notify.Event) {
	t.Helper()
	g := notify.NewRegistry()
	events = make(chan notify.Event, 4)
	g.Register("r", notify.Func(func(context.Context) error { return before },
		func(_ context.Context, ev notify.Event) error { events <- ev; return nil }))
	srv, err := g.Start(notify.WithSocketDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return events
}

// fakeCRIU is a process standing for CRIU: the watcher waits for its exit.
func fakeCRIU(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "30")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	return c
}

func waitEvent(t *testing.T, ch chan notify.Event) notify.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no after-restore event")
	}
	return notify.Event{}
}

func TestPreDumpThenFailedDumpResumes(t *testing.T) {
	events := startApp(t, nil)
	criu := fakeCRIU(t)
	watched := make(chan error, 1)
	o := Options{StateDir: t.TempDir(), HookBudget: 2 * time.Second}
	o.SpawnWatcher = func(file string) (func(bool), error) {
		r, w := io.Pipe()
		go func() { watched <- Watch(context.Background(), file, r, o) }()
		return func(ok bool) {
			if ok {
				w.Write([]byte(watchGo))
			}
			w.Close()
		}, nil
	}
	env := Env{Action: ActionPreDump, InitPID: os.Getpid(), CRIUPID: criu.Process.Pid}
	res, err := Run(context.Background(), env, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Targets) != 1 || res.Targets[0].PID != os.Getpid() {
		t.Fatalf("targets %+v, want this process", res.Targets)
	}
	select {
	case ev := <-events:
		t.Fatalf("resumed while CRIU still runs: %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
	criu.Process.Kill() // CRIU exits without post-dump: the dump failed
	ev := waitEvent(t, events)
	if ev.Kind != notify.Resume || ev.Reason != "dump failed" {
		t.Errorf("event %+v, want Resume after a failed dump", ev)
	}
	if err := <-watched; err != nil {
		t.Errorf("watch: %v", err)
	}
}

func TestPostDumpLeaveRunning(t *testing.T) {
	events := startApp(t, nil)
	criu := fakeCRIU(t)
	o := Options{StateDir: t.TempDir()}
	var file string
	o.SpawnWatcher = func(f string) (func(bool), error) { file = f; return func(bool) {}, nil }
	env := Env{Action: ActionPreDump, InitPID: os.Getpid(), CRIUPID: criu.Process.Pid}
	if _, err := Run(context.Background(), env, o); err != nil {
		t.Fatal(err)
	}
	env.Action = ActionPostDump
	if _, err := Run(context.Background(), env, o); err != nil {
		t.Fatal(err)
	}
	criu.Process.Kill()
	if err := Watch(context.Background(), file, strings.NewReader(watchGo), o); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, events); ev.Kind != notify.Resume || ev.Reason != "leave-running" {
		t.Errorf("event %+v, want Resume for leave-running", ev)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("state file left behind: %v", err)
	}
}

func TestPreDumpHookFails(t *testing.T) {
	events := startApp(t, errors.New("not now"))
	committed := make(chan bool, 1)
	o := Options{StateDir: t.TempDir(), SpawnWatcher: func(string) (func(bool), error) { return func(ok bool) { committed <- ok }, nil }}
	img := t.TempDir()
	_, err := Run(context.Background(), Env{Action: ActionPreDump, InitPID: os.Getpid(), CRIUPID: os.Getppid(), ImageDir: img}, o)
	var he *proto.HookFailure
	if !errors.As(err, &he) || len(he.Failed()) != 1 || !strings.HasPrefix(he.Msg, "PID ") || strings.Contains(he.Msg, ";") {
		t.Fatalf("err %v, want a HookFailure of one process", err)
	}
	// The reports say which target failed, for kcr checkpoint --container.
	var rep Result
	if b, err := os.ReadFile(filepath.Join(img, ReportsFile)); err != nil || json.Unmarshal(b, &rep) != nil ||
		len(rep.Targets) != 1 || !strings.Contains(rep.Targets[0].Error, "not now") {
		t.Errorf("reports after a failed hook: %v %+v", err, rep)
	}
	if ev := waitEvent(t, events); ev.Kind != notify.Resume {
		t.Errorf("event %+v, want Resume", ev)
	}
	// The watcher, started with the hooks, is told there is nothing to watch.
	select {
	case ok := <-committed:
		if ok {
			t.Error("the watcher was told to watch a failed checkpoint")
		}
	default:
		t.Error("the watcher was not told the checkpoint failed")
	}
}

// TestWatchGate: a watcher whose gate closes without go returns at once,
// leaving no error: pre-dump aborted and resumed the apps itself.
func TestWatchGate(t *testing.T) {
	o := Options{StateDir: t.TempDir()}
	if err := Watch(context.Background(), filepath.Join(o.StateDir, "criu-1.json"), strings.NewReader(""), o); err != nil {
		t.Errorf("Watch after an aborted pre-dump: %v", err)
	}
}

func TestWatcherCannotStart(t *testing.T) {
	events := startApp(t, nil)
	o := Options{StateDir: t.TempDir(), SpawnWatcher: func(string) (func(bool), error) { return nil, errors.New("no exec") }}
	_, err := Run(context.Background(), Env{Action: ActionPreDump, InitPID: os.Getpid(), CRIUPID: os.Getppid()}, o)
	if err == nil {
		t.Fatal("pre-dump succeeded without a watcher to resume the app")
	}
	if ev := waitEvent(t, events); ev.Kind != notify.Resume {
		t.Errorf("event %+v, want Resume", ev)
	}
}

func TestPostResumeRestores(t *testing.T) {
	events := startApp(t, nil)
	o := Options{StateDir: t.TempDir()}
	// A restore message needs a checkpoint waiting for it.
	o.SpawnWatcher = func(string) (func(bool), error) { return func(bool) {}, nil }
	criu := fakeCRIU(t)
	if _, err := Run(context.Background(), Env{Action: ActionPreDump, InitPID: os.Getpid(), CRIUPID: criu.Process.Pid}, o); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	res, err := Run(context.Background(), Env{Action: ActionPostResume, InitPID: os.Getpid(), ImageDir: img}, o)
	if err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, events); ev.Kind != notify.Restore || ev.Generation != 1 {
		t.Errorf("event %+v, want Restore generation 1", ev)
	}
	if len(res.Targets) != 1 {
		t.Errorf("targets %+v", res.Targets)
	}
}

func TestNoInitPID(t *testing.T) {
	if _, err := Run(context.Background(), Env{Action: ActionPreDump}, Options{}); err == nil {
		t.Fatal("pre-dump without CRTOOLS_INIT_PID succeeded")
	}
	if _, err := Run(context.Background(), Env{Action: "network-lock"}, Options{}); err != nil {
		t.Fatalf("other actions are no-ops: %v", err)
	}
}

// The generation kcr restore --container counted in the kcr image wins over
// CRIU's images directory, which is not the image's root.
func TestTakeGenerationFromEnv(t *testing.T) {
	t.Setenv(GenerationEnv, "7")
	o := Options{StateDir: t.TempDir()}
	o.defaults()
	dir := t.TempDir()
	if g := takeGeneration(Env{ImageDir: dir, CRIUPID: 1}, o); g != 7 {
		t.Fatalf("generation %d, want 7 from %s", g, GenerationEnv)
	}
	if err := postRestore(Env{ImageDir: dir, CRIUPID: 1}, o); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("post-restore counted in CRIU's directory too: %v", ents)
	}
}

// The hook budget comes from $KCR_HOOK_BUDGET, the name of --hook-budget;
// $KCR_HOOK_TIMEOUT, its former name, is read only when it is unset.
func TestOptionsFromEnvHookBudget(t *testing.T) {
	for _, tc := range []struct {
		budget, timeout string
		want            time.Duration
	}{
		{"3s", "", 3 * time.Second},
		{"", "4s", 4 * time.Second},
		{"3s", "4s", 3 * time.Second},
		{"", "", 0},
		{"nonsense", "", 0},
	} {
		t.Setenv(EnvHookBudget, tc.budget)
		t.Setenv(EnvTimeout, tc.timeout)
		if got := OptionsFromEnv().HookBudget; got != tc.want {
			t.Errorf("%s=%q %s=%q: HookBudget %v, want %v", EnvHookBudget, tc.budget, EnvTimeout, tc.timeout, got, tc.want)
		}
	}
}
