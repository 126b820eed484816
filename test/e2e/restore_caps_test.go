package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A restore by a kcr that lacks a capability the dumped process had
// (here CAP_SYS_PTRACE, out of kcr's bounding set) ends at once with one
// line naming the capability and the fix, restores nothing and keeps the
// image: a kcr with the capability then restores it. (It used to start
// CRIU, whose restorer failed to set the task's capabilities; CRIU then
// waited for the task and kcr for CRIU, far past --wait.)
func TestRestoreMissingCaps(t *testing.T) {
	need(t)
	a := startApp(t)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-all", kcrBin, "restore", "--wait", "3s", img)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("kcr restore without CAP_SYS_PTRACE still ran after 90 s: %s", out)
	}
	msg := strings.TrimSpace(string(out))
	if err == nil || strings.Contains(msg, "\n") || !strings.Contains(msg, "CAP_SYS_PTRACE") || !strings.Contains(msg, "run kcr with it") {
		t.Fatalf("kcr restore without CAP_SYS_PTRACE: %v, %q: want a one-line error naming it and the fix", err, msg)
	}
	if alive(a.pid) {
		t.Fatalf("PID %d runs after the refused restore", a.pid)
	}
	pid, _ := restore(t, img)
	if pid != a.pid || !alive(pid) {
		t.Fatalf("restored as PID %d (alive %v), want %d", pid, alive(pid), a.pid)
	}
}
