package notify_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// recorder logs every hook call of the resources it makes, in call order.
type recorder struct {
	mu     sync.Mutex
	calls  []string
	events map[string][]notify.Event
}

func newRecorder() *recorder { return &recorder{events: map[string][]notify.Event{}} }

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

// wantCalls fails t unless the calls since the last take are want, in
// order; what names them in the failure.
func (r *recorder) wantCalls(t *testing.T, what string, want []string) {
	t.Helper()
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func (r *recorder) eventsOf(name string) []notify.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[name])
}

// res makes a resource that records its calls and fails with the given
// errors (nil: succeeds).
func (r *recorder) res(name string, beforeErr, afterErr error) notify.Resource {
	return notify.Func(
		func(ctx context.Context) error {
			r.add("before:" + name)
			return beforeErr
		},
		func(ctx context.Context, ev notify.Event) error {
			r.add("after:" + name)
			r.mu.Lock()
			r.events[name] = append(r.events[name], ev)
			r.mu.Unlock()
			return afterErr
		})
}

// hookErrors flattens a joined error into its *HookErrors.
func hookErrors(t *testing.T, err error) []*notify.HookError {
	t.Helper()
	var out []*notify.HookError
	var walk func(error)
	walk = func(e error) {
		if he, ok := e.(*notify.HookError); ok {
			out = append(out, he)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

func names(reps []notify.Report) []string {
	var n []string
	for _, r := range reps {
		n = append(n, r.Name)
	}
	return n
}

func simulate(t *testing.T, g *notify.Registry, o notify.SimOutcome, budget time.Duration) notify.SimResult {
	t.Helper()
	r, err := g.Simulate(context.Background(), o, budget)
	if err != nil {
		t.Fatalf("Simulate: %v", err)
	}
	return r
}

func TestOrder(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	for _, n := range []string{"a", "b", "c", "d"} {
		g.Register(n, rec.res(n, nil, nil))
	}
	if got, want := g.Names(), []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Fatalf("Names = %v, want %v", got, want)
	}
	r := simulate(t, g, notify.SimRestore, time.Second)
	want := []string{"before:d", "before:c", "before:b", "before:a", "after:a", "after:b", "after:c", "after:d"}
	rec.wantCalls(t, "calls", want)
	if got := names(r.Before); !slices.Equal(got, []string{"d", "c", "b", "a"}) {
		t.Errorf("before reports = %v", got)
	}
	if got := names(r.After); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("after reports = %v", got)
	}
	if r.BeforeErr != nil || r.AfterErr != nil {
		t.Errorf("errors: %v / %v", r.BeforeErr, r.AfterErr)
	}
	if r.Event.Kind != notify.Restore || r.Event.SelfDetected {
		t.Errorf("event = %+v, want a Restore", r.Event)
	}
}

func TestEmptyRegistry(t *testing.T) {
	g := notify.NewRegistry()
	r := simulate(t, g, notify.SimRestore, 0)
	if len(r.Before) != 0 || len(r.After) != 0 || r.BeforeErr != nil || r.AfterErr != nil {
		t.Fatalf("empty registry: %+v", r)
	}
	if r.Event.Kind != notify.Restore || r.Event.Generation != 1 {
		t.Fatalf("event = %+v", r.Event)
	}
}

func TestBeforeFailureNotifiesAllAndResumes(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	errB := errors.New("b is stuck")
	errD := errors.New("d refuses")
	g.Register("a", rec.res("a", nil, nil))
	g.Register("b", rec.res("b", errB, nil))
	g.Register("c", rec.res("c", nil, nil))
	g.Register("d", rec.res("d", errD, nil))
	gen0, id0 := g.Identity()

	r := simulate(t, g, notify.SimRestore, time.Second)
	want := []string{"before:d", "before:c", "before:b", "before:a", "after:a", "after:b", "after:c", "after:d"}
	rec.wantCalls(t, "calls (every resource notified, failing ones resumed too)", want)
	if r.BeforeErr == nil {
		t.Fatal("no BeforeErr")
	}
	if !errors.Is(r.BeforeErr, errB) || !errors.Is(r.BeforeErr, errD) {
		t.Errorf("errors.Is does not find both causes in %v", r.BeforeErr)
	}
	var he *notify.HookError
	if !errors.As(r.BeforeErr, &he) {
		t.Fatalf("errors.As(*HookError) failed on %v", r.BeforeErr)
	}
	hes := hookErrors(t, r.BeforeErr)
	var failed []string
	for _, h := range hes {
		failed = append(failed, h.Resource)
		if h.Phase != "before-checkpoint" {
			t.Errorf("phase of %s = %q", h.Resource, h.Phase)
		}
		if !strings.Contains(h.Error(), fmt.Sprintf("%q", h.Resource)) {
			t.Errorf("HookError %q does not name its resource", h.Error())
		}
	}
	slices.Sort(failed)
	if !slices.Equal(failed, []string{"b", "d"}) {
		t.Errorf("failing resources = %v, want [b d]", failed)
	}
	for _, rep := range r.Before {
		if (rep.Name == "b" || rep.Name == "d") != (rep.Error != "") {
			t.Errorf("report %+v: error field wrong", rep)
		}
	}
	if r.Event.Kind != notify.Resume || !strings.HasPrefix(r.Event.Reason, "checkpoint failed") {
		t.Errorf("event = %+v, want Resume after a failed checkpoint", r.Event)
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		evs := rec.eventsOf(n)
		if len(evs) != 1 || evs[0].Kind != notify.Resume {
			t.Errorf("%s got events %+v, want one Resume", n, evs)
		}
	}
	if gen, id := g.Identity(); gen != gen0 || id != id0 {
		t.Errorf("identity changed on a resume: %d %s -> %d %s", gen0, id0, gen, id)
	}
	if r.Event.InstanceID != id0 || r.Event.Generation != gen0 {
		t.Errorf("event identity = %d %s, want %d %s", r.Event.Generation, r.Event.InstanceID, gen0, id0)
	}
}

func TestAfterErrorsJoined(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	g.Register("a", rec.res("a", nil, errors.New("reopen a")))
	g.Register("b", rec.res("b", nil, nil))
	g.Register("c", rec.res("c", nil, errors.New("reopen c")))
	r := simulate(t, g, notify.SimRestore, time.Second)
	if r.BeforeErr != nil {
		t.Fatal(r.BeforeErr)
	}
	want := []string{"before:c", "before:b", "before:a", "after:a", "after:b", "after:c"}
	rec.wantCalls(t, "calls", want)
	hes := hookErrors(t, r.AfterErr)
	if len(hes) != 2 || hes[0].Resource != "a" || hes[1].Resource != "c" {
		t.Fatalf("after errors = %v", r.AfterErr)
	}
	for _, h := range hes {
		if h.Phase != "after-restore" {
			t.Errorf("phase = %q", h.Phase)
		}
	}
}

func TestHungHookDeadline(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	g.Register("a", rec.res("a", nil, nil))
	g.Register("hung", notify.Func(func(ctx context.Context) error {
		rec.add("before:hung")
		<-release // ignores ctx
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		rec.add("after:hung")
		return nil
	}))
	g.Register("polite", notify.Func(func(ctx context.Context) error {
		rec.add("before:polite")
		<-ctx.Done()
		return ctx.Err()
	}, nil))
	g.Register("c", rec.res("c", nil, nil))

	const budget = 150 * time.Millisecond
	start := time.Now()
	r := simulate(t, g, notify.SimRestore, budget)
	if el := time.Since(start); el > budget+5*notify.HookGrace+500*time.Millisecond {
		t.Fatalf("cycle took %v with a budget of %v: it waited for the hung hook", el, budget)
	}
	want := []string{"before:c", "before:polite", "before:hung", "before:a", "after:a", "after:hung", "after:c"}
	rec.wantCalls(t, "calls", want)
	hes := hookErrors(t, r.BeforeErr)
	if len(hes) != 2 {
		t.Fatalf("before errors = %v", r.BeforeErr)
	}
	byName := map[string]*notify.HookError{}
	for _, h := range hes {
		byName[h.Resource] = h
	}
	hung := byName["hung"]
	if hung == nil || !errors.Is(hung, context.DeadlineExceeded) || !strings.Contains(hung.Error(), "did not return within its deadline") {
		t.Errorf("hung hook error = %v", hung)
	}
	polite := byName["polite"]
	if polite == nil || !errors.Is(polite, context.DeadlineExceeded) || strings.Contains(polite.Error(), "did not return") {
		t.Errorf("polite hook error = %v (it returned, it is not hung)", polite)
	}
	if r.Event.Kind != notify.Resume {
		t.Errorf("event = %+v, want Resume", r.Event)
	}
}

func TestHungAfterHook(t *testing.T) {
	g := notify.NewRegistry()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	g.Register("hung", notify.Func(nil, func(ctx context.Context, ev notify.Event) error {
		<-release
		return nil
	}))
	start := time.Now()
	r := simulate(t, g, notify.SimResume, 100*time.Millisecond)
	if el := time.Since(start); el > time.Second {
		t.Fatalf("after phase took %v", el)
	}
	if hes := hookErrors(t, r.AfterErr); len(hes) != 1 || hes[0].Resource != "hung" || !errors.Is(hes[0], context.DeadlineExceeded) {
		t.Fatalf("after errors = %v", r.AfterErr)
	}
}

func TestPanicBecomesError(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	g.Register("a", rec.res("a", nil, nil))
	g.Register("boom", notify.Func(func(ctx context.Context) error {
		panic("before boom")
	}, func(ctx context.Context, ev notify.Event) error {
		panic(fmt.Errorf("after boom"))
	}))
	g.Register("c", rec.res("c", nil, nil))
	r := simulate(t, g, notify.SimRestore, time.Second)
	hes := hookErrors(t, r.BeforeErr)
	if len(hes) != 1 || hes[0].Resource != "boom" || !strings.Contains(hes[0].Error(), "panic: before boom") {
		t.Fatalf("before errors = %v", r.BeforeErr)
	}
	hes = hookErrors(t, r.AfterErr)
	if len(hes) != 1 || hes[0].Resource != "boom" || !strings.Contains(hes[0].Error(), "panic: after boom") {
		t.Fatalf("after errors = %v", r.AfterErr)
	}
	rec.wantCalls(t, "calls", []string{"before:c", "before:a", "after:a", "after:c"})
	if r.Event.Kind != notify.Resume {
		t.Errorf("event = %+v", r.Event)
	}
}

func TestRegisterFromBeforeHookJoinsCycle(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	var once sync.Once
	g.Register("a", rec.res("a", nil, nil))
	g.Register("b", notify.Func(func(ctx context.Context) error {
		rec.add("before:b")
		// Registers from inside a hook: must not block, and x joins this cycle.
		once.Do(func() {
			g.Register("x", rec.res("x", nil, nil))
			g.Register("y", rec.res("y", nil, nil))
		})
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		rec.add("after:b")
		return nil
	}))
	done := make(chan notify.SimResult)
	go func() {
		r, _ := g.Simulate(context.Background(), notify.SimRestore, time.Second)
		done <- r
	}()
	var r notify.SimResult
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: Register from a before hook")
	}
	// The newcomers run after every resource registered before them, in
	// reverse order among themselves, and are resumed last.
	want := []string{"before:b", "before:a", "before:y", "before:x", "after:a", "after:b", "after:x", "after:y"}
	rec.wantCalls(t, "calls", want)
	if len(r.LateJoiners) != 0 {
		t.Errorf("late joiners = %v, want none", r.LateJoiners)
	}
}

func TestRegisterAfterBeforePhaseIsLateJoiner(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	var once sync.Once
	g.Register("a", notify.Func(func(ctx context.Context) error {
		rec.add("before:a")
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		rec.add("after:a")
		once.Do(func() { g.Register("late", rec.res("late", nil, nil)) })
		return nil
	}))
	r := simulate(t, g, notify.SimRestore, time.Second)
	rec.wantCalls(t, "calls", []string{"before:a", "after:a"})
	if !slices.Equal(r.LateJoiners, []string{"late"}) {
		t.Errorf("late joiners = %v, want [late]", r.LateJoiners)
	}
	r = simulate(t, g, notify.SimRestore, time.Second)
	rec.wantCalls(t, "next cycle calls", []string{"before:late", "before:a", "after:a", "after:late"})
	if len(r.LateJoiners) != 0 {
		t.Errorf("late joiners of the next cycle = %v", r.LateJoiners)
	}
}

func TestUnregister(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	g.Register("a", rec.res("a", nil, nil))
	unB := g.Register("b", rec.res("b", nil, nil))
	g.Register("c", rec.res("c", nil, nil))
	unB()
	unB() // idempotent
	if got := g.Names(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("Names = %v", got)
	}
	simulate(t, g, notify.SimResume, time.Second)
	rec.wantCalls(t, "calls", []string{"before:c", "before:a", "after:a", "after:c"})

	// Unregistering during a cycle does not take the resource out of it.
	var unD func()
	unD = g.Register("d", notify.Func(func(ctx context.Context) error {
		rec.add("before:d")
		unD()
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		rec.add("after:d")
		return nil
	}))
	simulate(t, g, notify.SimResume, time.Second)
	rec.wantCalls(t, "calls", []string{"before:d", "before:c", "before:a", "after:a", "after:c", "after:d"})
	simulate(t, g, notify.SimResume, time.Second)
	rec.wantCalls(t, "calls after unregister", []string{"before:c", "before:a", "after:a", "after:c"})
}

func TestRegisterNilPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Register(nil) did not panic")
		}
	}()
	notify.NewRegistry().Register("nil", nil)
}

func TestFuncNil(t *testing.T) {
	g := notify.NewRegistry()
	g.Register("nothing", notify.Func(nil, nil))
	r := simulate(t, g, notify.SimRestore, time.Second)
	if r.BeforeErr != nil || r.AfterErr != nil || len(r.Before) != 1 || len(r.After) != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestSimulateBusy(t *testing.T) {
	g := notify.NewRegistry()
	entered := make(chan struct{})
	release := make(chan struct{})
	g.Register("slow", notify.Func(func(ctx context.Context) error {
		close(entered)
		<-release
		return nil
	}, nil))
	done := make(chan error)
	go func() {
		_, err := g.Simulate(context.Background(), notify.SimResume, 5*time.Second)
		done <- err
	}()
	<-entered
	if _, err := g.Simulate(context.Background(), notify.SimResume, time.Second); !errors.Is(err, notify.ErrBusy) {
		t.Fatalf("concurrent Simulate: err = %v, want ErrBusy", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Free again.
	if _, err := g.Simulate(context.Background(), notify.SimResume, time.Second); err != nil {
		t.Fatalf("Simulate after the busy one ended: %v", err)
	}
}

var hexID = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestIdentity(t *testing.T) {
	g := notify.NewRegistry()
	rec := newRecorder()
	g.Register("a", rec.res("a", nil, nil))
	gen0, id0 := g.Identity()
	if gen0 != 0 || !hexID.MatchString(id0) {
		t.Fatalf("initial identity %d %q", gen0, id0)
	}
	if _, other := notify.NewRegistry().Identity(); other == id0 {
		t.Fatal("two registries drew the same instance id")
	}

	r := simulate(t, g, notify.SimResume, time.Second)
	if gen, id := g.Identity(); gen != 0 || id != id0 || r.Event.Generation != 0 || r.Event.InstanceID != id0 || r.Event.Kind != notify.Resume {
		t.Fatalf("resume changed identity: %d %s, event %+v", gen, id, r.Event)
	}

	seen := map[string]bool{id0: true}
	for want := uint64(1); want <= 3; want++ {
		r = simulate(t, g, notify.SimRestore, time.Second)
		gen, id := g.Identity()
		if gen != want || r.Event.Generation != want {
			t.Fatalf("restore %d: generation %d, event %d", want, gen, r.Event.Generation)
		}
		if !hexID.MatchString(id) || seen[id] || r.Event.InstanceID != id {
			t.Fatalf("restore %d: instance id %q (event %q) not new", want, id, r.Event.InstanceID)
		}
		seen[id] = true
	}
	evs := rec.eventsOf("a")
	if len(evs) != 4 || evs[3].Kind != notify.Restore || evs[3].Generation != 3 {
		t.Fatalf("hook events = %+v", evs)
	}
}

type reporting struct {
	mu     sync.Mutex
	closed int
}

func (r *reporting) BeforeCheckpoint(ctx context.Context) error {
	r.mu.Lock()
	r.closed = 3
	r.mu.Unlock()
	return nil
}

func (r *reporting) AfterRestore(ctx context.Context, ev notify.Event) error {
	r.mu.Lock()
	r.closed = 0
	r.mu.Unlock()
	return nil
}

func (r *reporting) CheckpointReport() map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]any{"closed_conns": r.closed}
}

func TestReporterDetails(t *testing.T) {
	g := notify.NewRegistry()
	g.Register("pool", &reporting{})
	g.Register("plain", notify.Func(nil, nil))
	r := simulate(t, g, notify.SimRestore, time.Second)
	if len(r.Before) != 2 || r.Before[1].Name != "pool" || r.Before[1].Details["closed_conns"] != 3 {
		t.Fatalf("before reports = %+v", r.Before)
	}
	if r.Before[0].Details != nil {
		t.Errorf("plain resource has details %v", r.Before[0].Details)
	}
	if r.After[0].Name != "pool" || r.After[0].Details["closed_conns"] != 0 {
		t.Fatalf("after reports = %+v", r.After)
	}
	for _, rep := range append(r.Before, r.After...) {
		if rep.Duration < 0 {
			t.Errorf("negative duration in %+v", rep)
		}
	}
}

// TestConcurrentRegister runs cycles while other goroutines register and
// unregister, for the race detector and to show it never deadlocks.
func TestConcurrentRegister(t *testing.T) {
	g := notify.NewRegistry()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				un := g.Register(fmt.Sprintf("r%d-%d", i, j), notify.Func(nil, nil))
				if j%2 == 0 {
					un()
				}
				_ = g.Names()
				g.Identity()
				if j%20 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	start := time.Now()
	for range 30 {
		if _, err := g.Simulate(context.Background(), notify.SimRestore, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("cycles took %v", el)
	}
	if n := len(g.Names()); n != 4*100 {
		t.Fatalf("%d resources left, want 400", n)
	}
}

// TestEndlessRegistrationsStopAtDeadline: a hook that registers a new
// resource every time it runs must not keep the before phase going forever.
func TestEndlessRegistrationsStopAtDeadline(t *testing.T) {
	g := notify.NewRegistry()
	var chain func(i int) notify.Resource
	chain = func(i int) notify.Resource {
		return notify.Func(func(ctx context.Context) error {
			time.Sleep(5 * time.Millisecond)
			g.Register(fmt.Sprintf("chain-%d", i+1), chain(i+1))
			return nil
		}, nil)
	}
	g.Register("chain-0", chain(0))
	done := make(chan notify.SimResult)
	go func() {
		r, _ := g.Simulate(context.Background(), notify.SimRestore, 200*time.Millisecond)
		done <- r
	}()
	select {
	case r := <-done:
		if len(r.Before) < 5 {
			t.Errorf("only %d links ran before the deadline", len(r.Before))
		}
		if len(r.LateJoiners) != 1 || len(r.After) != len(r.Before) {
			t.Errorf("late joiners %v, %d before, %d after", r.LateJoiners, len(r.Before), len(r.After))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("before phase did not end at its deadline")
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[notify.Kind]string{notify.Resume: "resume", notify.Restore: "restore", notify.Kind(9): "Kind(9)"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(k), k.String(), want)
		}
	}
}

func TestParseStartTime(t *testing.T) {
	tail := func(start string) string {
		// fields 3..21, then 22 = start, then a few more
		return " S 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 " + start + " 23 24 25\n"
	}
	for _, tc := range []struct {
		name, stat string
		want       uint64
		err        bool
	}{
		{"plain", "1234 (kcr-app)" + tail("987654"), 987654, false},
		{"parens and spaces", "1234 (a) b (c)" + tail("42"), 42, false},
		{"trailing paren", "1234 (x) )" + tail("43"), 43, false},
		{"lone open paren", "1234 (()" + tail("44"), 44, false},
		{"fake fields in comm", "1234 (1 2 3) 4 5)" + tail("45"), 45, false},
		{"empty comm", "1234 ()" + tail("46"), 46, false},
		{"no paren", "1234 app S 1 2 3", 0, true},
		{"truncated", "1234 (app) S 1 2 3", 0, true},
		{"not a number", "1234 (app)" + tail("x"), 0, true},
		{"empty", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := notify.ParseStartTime([]byte(tc.stat))
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("parseStartTime(%q) = %d, %v; want %d, err=%v", tc.stat, got, err, tc.want, tc.err)
			}
		})
	}
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip(err)
	}
	if st, err := notify.ParseStartTime(b); err != nil || st == 0 {
		t.Fatalf("real /proc/self/stat %q: %d, %v", b, st, err)
	}
}
