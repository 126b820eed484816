package e2e

import (
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// TestRestoreAfterSelfResume: the app resumes on its own before CRIU
// freezes it (--resume-after 1ns), so the image is of an idle app. Its
// restored copy must still find out that it is a new instance and run its
// restore hooks.
func TestRestoreAfterSelfResume(t *testing.T) {
	_, a := startEchoApp(t)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--tcp-close", "--resume-after", "1ns", "-o", img, strconv.Itoa(a.pid))
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the checkpointed process is still running")
	}
	a.waitEvent(time.Second, func(e event) bool { return e["ev"] == "after" && e.str("kind") == "resume" })
	n := len(a.events())

	// kcr's after-restore message finds no waiting checkpoint: the copy,
	// restored from an idle image, runs a whole cycle for it (or its own
	// watch already did, 250 ms at most after the restore). The dump may
	// also catch the app inside its own resume, with the conn hook's dial
	// under way: the copy then ends that resume first, once the dial, whose
	// socket the restore left closed (--tcp-close), times out (testapp's
	// 5 s), and its watch sees the restore 250 ms later (ci16 at 5510d8b:
	// the resume ended 4.95 s after the restore).
	r := runKCR(t, kcrOpts{log: logAll}, "restore", img)
	t.Cleanup(func() { killWait(a.pid) })
	if !alive(a.pid) {
		t.Fatalf("restore exit %d, and the copy is not running: %s", r.code, r.stderr)
	}
	var e event
	if !wait.Until(15*time.Second, func() bool {
		evs := a.since(n)
		i := slices.IndexFunc(evs, func(e event) bool { return e["ev"] == "after" && e.str("kind") == "restore" })
		if i >= 0 {
			e = evs[i]
		}
		return i >= 0
	}) {
		t.Fatalf("the copy never ran its restore hooks; events since the restore: %v", a.since(n))
	}
	if r.code != 0 && e["self"] != true {
		t.Fatalf("kcr restore exit %d although the app took its message: %v", r.code, e)
	}
}
