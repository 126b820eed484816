package criu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without CAP_SYS_RESOURCE (every documented pod) CRIU logs and prints an
// rlimit error and carries on: beside the log's real error, neither that
// line nor anything criu printed gives the failure a cause, nor a hint
// about capabilities or seccomp.
func TestHintIgnoresRlimitBesideRealError(t *testing.T) {
	geteuid = func() int { return 0 }
	t.Cleanup(func() { geteuid = os.Geteuid })
	log := filepath.Join(t.TempDir(), "dump.log")
	body := "Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
		"Error (criu/files-reg.c:1790): Can't lookup mount=24 for fd=10 path=/dev/null\n" +
		"Error (criu/cr-dump.c:1975): Dumping FAILED.\n"
	if err := os.WriteFile(log, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out := "Error (criu/cr-service.c:1180): Can't raise RLIM_NOFILE: Operation not permitted\nsetsockopt: Operation not permitted"
	e := newError("dump", log, out, nil)
	if e.First != "Can't lookup mount=24 for fd=10 path=/dev/null" || e.Cause != CauseUnknown || e.Hint != "" {
		t.Errorf("first %q, cause %q, hint %q: want the mount error, no cause, no hint", e.First, e.Cause, e.Hint)
	}
	// With no log, what criu printed still explains a refusal.
	e = newError("dump", filepath.Join(t.TempDir(), "none.log"), "CRIU needs to have the CAP_SYS_ADMIN or the CAP_CHECKPOINT_RESTORE capability", nil)
	if e.Cause != CausePermission || !strings.Contains(e.Hint, "refused") {
		t.Errorf("no log: cause %q hint %q, want permission", e.Cause, e.Hint)
	}
	for _, l := range []string{"rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted", "Can't set nr_open: Operation not permitted"} {
		if !harmless(l) {
			t.Errorf("%q is not harmless", l)
		}
	}
}
