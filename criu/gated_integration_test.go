package criu

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// atPreDump waits until CRIU's log says it is about to run the pre-dump
// stage (its kernel probing is done), then a little longer, so that a CRIU
// that did not stop there would have seized the tree by then.
func atPreDump(t *testing.T, log string) {
	t.Helper()
	var b []byte
	if !wait.Until(10*time.Second, func() bool {
		b, _ = os.ReadFile(log)
		return strings.Contains(string(b), "Dumping processes")
	}) {
		t.Fatalf("CRIU never reached its pre-dump stage; log:\n%s", b)
	}
	time.Sleep(200 * time.Millisecond)
}

// untouched fails if the target is traced (seized by CRIU) or stopped.
func untouched(t *testing.T, pid int, when string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "TracerPid:" && f[1] != "0" || f[0] == "State:" && (f[1] == "t" || f[1] == "T")) {
			t.Errorf("%s: target %s", when, line)
		}
	}
}

// begin starts a target and a CRIU session and begins a dump of the
// target with opts (PID and ImagesDir set here); CRIU is cancelled and the
// session closed when the test ends.
func begin(t *testing.T, opts DumpOptions) (*target, string, *Session, *PendingDump) {
	t.Helper()
	criu := needCRIU(t)
	tg := startTarget(t, false)
	img := mkdir(t, "img")
	ss, err := StartSession(context.Background(), criu, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ss.Close)
	opts.PID, opts.ImagesDir = tg.pid, img
	p, err := ss.Begin(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Cancel)
	return tg, img, ss, p
}

// A begun dump stops at CRIU's pre-dump stage, after CRIU's own
// preparation (Ready returns then), without touching the tree; Go then
// dumps it.
func TestE2EGatedDump(t *testing.T) {
	ctx := context.Background()
	begun := time.Now()
	tg, img, _, p := begin(t, DumpOptions{LeaveRunning: true, LogLevel: 4})
	if err := p.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	if b, _ := os.ReadFile(filepath.Join(img, "dump.log")); !strings.Contains(string(b), "Dumping processes") {
		t.Errorf("Ready returned before CRIU's pre-dump stage; log:\n%s", b)
	}
	if err := p.Ready(ctx); err != nil {
		t.Errorf("second Ready: %v", err)
	}
	atPreDump(t, filepath.Join(img, "dump.log"))
	untouched(t, tg.pid, "before Go")
	if _, err := os.Stat(filepath.Join(img, StatsDumpFile)); err == nil {
		t.Fatal("CRIU dumped before Go")
	}
	tg.waitTicks(t, tg.lastTick(t))

	res, err := p.Go(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res.Wait()
	if res.StatsErr != nil || res.Stats.PagesWritten == 0 {
		t.Errorf("stats %+v, %v", res.Stats, res.StatsErr)
	}
	if !res.Ready.After(begun) || res.Ready.After(ready) {
		t.Errorf("Ready %v, begun %v", res.Ready, begun)
	}
	if _, err := p.Go(ctx); err == nil {
		t.Error("a second Go succeeded")
	}
	tg.waitTicks(t, tg.lastTick(t))
}

// A cancelled pending dump kills CRIU before it seized the tree: the
// target runs on untraced, and nothing was dumped.
func TestE2EGatedDumpCancel(t *testing.T) {
	ctx := context.Background()
	tg, img, _, p := begin(t, DumpOptions{LogLevel: 4})
	criuPID := p.s.cmd.Process.Pid
	atPreDump(t, filepath.Join(img, "dump.log"))
	p.Cancel()
	p.Cancel() // idempotent
	if _, err := os.Stat("/proc/" + strconv.Itoa(criuPID)); err == nil {
		t.Errorf("CRIU (PID %d) still exists after Cancel", criuPID)
	}
	untouched(t, tg.pid, "after Cancel")
	if _, err := os.Stat(filepath.Join(img, StatsDumpFile)); err == nil {
		t.Error("CRIU dumped although cancelled")
	}
	if _, err := p.Go(ctx); err == nil {
		t.Error("Go after Cancel succeeded")
	}
	tg.waitTicks(t, tg.lastTick(t))
}

// The session's CRIU answers its version itself, the same as
// "criu --version", and then serves the dump.
func TestE2ESessionVersion(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	want, err := ReadVersion(ctx, criu)
	if err != nil {
		t.Fatal(err)
	}
	tg, _, ss, p := begin(t, DumpOptions{LeaveRunning: true})
	v, err := ss.Version()
	if err != nil || v != want {
		t.Fatalf("session version %+v, %v; criu --version %+v", v, err, want)
	}
	if v2, err := ss.Version(); v2 != v || err != nil {
		t.Errorf("second Version %+v, %v", v2, err)
	}
	res, err := p.Go(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res.Wait()
	if res.StatsErr != nil {
		t.Error(res.StatsErr)
	}
	tg.waitTicks(t, tg.lastTick(t))
}
