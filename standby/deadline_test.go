package standby

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// --stuck-after is the deadline of a checkpoint: one that hangs fails once
// it passes, and the service runs on.
func TestCheckpointDeadline(t *testing.T) {
	f := newFake()
	f.ckptDelay = time.Hour
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.StuckAfter = 300 * time.Millisecond })
	if !wait.Until(10*time.Second, func() bool {
		return strings.Contains(r.log.String(), "checkpoint refused or failed; the service resumed and runs on")
	}) {
		t.Fatalf("no failed checkpoint within 10 s of a 300 ms deadline; log:\n%s", r.log.String())
	}
	if !strings.Contains(r.log.String(), "deadline exceeded") {
		t.Errorf("the failure does not name the deadline:\n%s", r.log.String())
	}
	r.waitState(StateRunning)
}

// --stuck-after is the deadline of a restore: one that hangs fails once it
// passes, and the service starts cold.
func TestRestoreDeadline(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.StuckAfter = 300 * time.Millisecond })
	r.waitState(StateStandby)
	f.mu.Lock()
	f.restoreHangs = true
	f.mu.Unlock()
	r.s.Wake("manual")
	if !wait.Until(10*time.Second, func() bool { starts, _, _ := f.snapshot(); return starts == 2 }) {
		t.Fatalf("no cold start within 10 s of a hung restore's 300 ms deadline; log:\n%s", r.log.String())
	}
	if !strings.Contains(r.log.String(), "restore failed; starting the service cold") {
		t.Errorf("the failed restore is not logged:\n%s", r.log.String())
	}
}
