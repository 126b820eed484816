package criu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A CRIU whose restorer fails late (here: capset refused, as CRIU runs
// without a capability the dumped task had, CAP_SYS_BOOT, which CRIU
// itself never uses) does not answer: its tasks
// wait in the restorer and CRIU waits for them. At the restore's deadline
// CRIU is killed KillGrace later, and so is the tree it forked: no task is
// left half-restored holding the image's PIDs. (Killing CRIU alone left the
// task waiting in the restorer for good.)
func TestE2ERestorerFailsKilledWithTree(t *testing.T) {
	criu := needCRIU(t)
	tg := startTarget(t, false)
	img := tg.dumpGone(t, criu)
	if c, err := ImageCaps(img); err != nil || c.Prm&(1<<22) == 0 {
		t.Fatalf("the dumped helper's permitted set %x (%v) lacks CAP_SYS_BOOT", c.Prm, err)
	}
	// CRIU run without CAP_SYS_BOOT in its bounding (so permitted) set.
	weak := filepath.Join(t.TempDir(), "criu")
	script := "#!/bin/sh\nexec setpriv --bounding-set -sys_boot --inh-caps -all " + criu + " \"$@\"\n"
	if err := os.WriteFile(weak, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(g time.Duration) { KillGrace = g }(KillGrace)
	KillGrace = time.Second
	const deadline = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	work := mkdir(t, "work")
	start := time.Now()
	_, err := Restore(ctx, weak, RestoreOptions{ImagesDir: img, WorkDir: work})
	took := time.Since(start)
	if err == nil {
		t.Fatal("a restore whose CRIU lacks the task's capabilities succeeded")
	}
	if took > deadline+KillGrace+30*time.Second {
		t.Errorf("the restore returned %s after its start, its deadline %s", took, deadline)
	}
	log, _ := os.ReadFile(filepath.Join(work, "restore.log"))
	if !strings.Contains(string(log), "Unable to restore capabilities") {
		t.Logf("CRIU failed otherwise than in its restorer (%v); its log:\n%s", err, log)
	}
	if !errors.Is(err, context.DeadlineExceeded) && strings.Contains(string(log), "Unable to restore capabilities") {
		t.Errorf("restore = %v, want the deadline's error", err)
	}
	if _, err := WaitGone(context.Background(), tg.pid, 30*time.Second); err != nil {
		t.Fatalf("the half-restored task stayed: %v", err)
	}
}

// A restore stuck with its tasks in CRIU's restorer (here: its caller
// does not answer post-restore, as one writing to a hung volume would not)
// is killed KillGrace after its context ended, CRIU and the tasks it
// forked: a task in the restorer never runs without CRIU.
func TestE2ERestoreStuckKilledWithTree(t *testing.T) {
	criu := needCRIU(t)
	tg := startTarget(t, false)
	img := tg.dumpGone(t, criu)
	defer func(g time.Duration) { KillGrace = g }(KillGrace)
	KillGrace = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forked := false
	_, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, "work"),
		Notify: func(script string, pid int) error {
			if script == "post-restore" {
				forked = restoring(tg.pid)
				cancel()
				// Stuck past KillGrace: CRIU is killed meanwhile.
				time.Sleep(KillGrace + 3*time.Second)
			}
			return nil
		}})
	if err == nil {
		t.Fatal("a restore killed at post-restore succeeded")
	}
	if !forked {
		t.Fatal("the task was not CRIU's child at post-restore")
	}
	if _, err := WaitGone(context.Background(), tg.pid, 30*time.Second); err != nil {
		t.Fatalf("the half-restored task stayed: %v", err)
	}
}
