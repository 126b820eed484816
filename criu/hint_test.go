package criu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without CAP_SYS_RESOURCE (every documented pod) CRIU logs and prints an
// rlimit error and carries on: beside the log's real error, neither that
// line nor anything criu printed gives the failure a hint about
// capabilities or seccomp: the log's error is the cause.
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
	if e.First != "Can't lookup mount=24 for fd=10 path=/dev/null" || e.Cause != CauseMountLookup || strings.Contains(e.Hint, "seccomp") {
		t.Errorf("first %q, cause %q, hint %q: want the mount error as the cause, no privilege hint", e.First, e.Cause, e.Hint)
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

// A descriptor on a mount CRIU cannot find (a shell's /dev/null inherited
// into a service with a mount namespace of its own) is named as such, with
// no hint about privileges, even when CRIU's clean-up after it is refused
// something: a refusal counts only as the log's first real error.
func TestHintMountLookup(t *testing.T) {
	geteuid = func() int { return 0 }
	t.Cleanup(func() { geteuid = os.Geteuid })
	for _, body := range []string{
		"(00.009873) Error (criu/files-reg.c:1790): Can't lookup mount=24 for fd=10 path=/dev/null\n" +
			"(00.009901) Error (criu/cr-dump.c:1620): Dump files (pid: 4172) failed with -1\n" +
			"(00.012230) Error (criu/cr-dump.c:1975): Dumping FAILED.\n",
		"(00.000312) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
			"(00.010554) Error (criu/files-reg.c:1790): Can't lookup mount=1123 for fd=2 path=/var/log/svc.log\n" +
			"(00.010601) Error (criu/cr-dump.c:1620): Dump files (pid: 88) failed with -1\n" +
			"(00.011902) Error (criu/cr-dump.c:2062): Can't unlink /run/criu.pid: Permission denied\n" +
			"(00.011930) Error (criu/cr-dump.c:1975): Dumping FAILED.\n",
	} {
		log := filepath.Join(t.TempDir(), "dump.log")
		if err := os.WriteFile(log, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		e := newError("dump", log, "Error (criu/cr-service.c:1180): Can't raise RLIM_NOFILE: Operation not permitted", nil)
		if !strings.HasPrefix(e.First, "Can't lookup mount=") || e.Cause != CauseMountLookup {
			t.Errorf("first %q cause %q, want the mount lookup", e.First, e.Cause)
		}
		if !strings.Contains(e.Hint, "mount namespace") || strings.Contains(e.Hint, "seccomp") || strings.Contains(e.Hint, "CAP_") {
			t.Errorf("hint %q: want the descriptor's mount named, no privilege", e.Hint)
		}
	}
}

// A refusal that is the log's first real error still gets the privilege
// hint, whatever follows it.
func TestHintPermissionFirst(t *testing.T) {
	geteuid = func() int { return 0 }
	t.Cleanup(func() { geteuid = os.Geteuid })
	body := "(00.004410) Error (criu/proc_parse.c:2718): Can't open dir /proc/22975/fd/8: Permission denied\n" +
		"(00.004502) Error (criu/files-reg.c:1790): Can't lookup mount=24 for fd=8 path=/dev/null\n" +
		"(00.004530) Error (criu/cr-dump.c:1975): Dumping FAILED.\n"
	first, c := parseLog(strings.NewReader(body))
	if c != CausePermission || !strings.Contains(first, "Permission denied") {
		t.Errorf("first %q cause %q, want permission", first, c)
	}
	if h := c.Hint(); !strings.Contains(h, "seccomp") {
		t.Errorf("hint %q, want the refusal's", h)
	}
}

// A dump by a CRIU under a seccomp filter of a process with one (any
// container's profile but Unconfined) fails at the seize: the hint names
// the filter, not a process gone (CRIU's detach after it says No such
// process) nor a missing capability. The log is CRIU 4.2.1's, in a filter
// that allows every call.
func TestHintSeccomp(t *testing.T) {
	geteuid = func() int { return 0 }
	t.Cleanup(func() { geteuid = os.Geteuid })
	body := "(00.095917) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
		"(00.105647) Error (compel/src/lib/ptrace.c:27): suspending seccomp failed: Operation not permitted\n" +
		"(00.105692) Error (compel/src/lib/infect.c:417): Unable to detach from 15486: No such process\n" +
		"(00.105709) Error (criu/cr-dump.c:1975): Dumping FAILED.\n"
	log := filepath.Join(t.TempDir(), "dump.log")
	if err := os.WriteFile(log, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newError("dump", log, "", nil)
	if e.Cause != CauseSeccomp || !strings.Contains(e.Hint, "Unconfined") || !strings.HasPrefix(e.First, "suspending seccomp failed") {
		t.Errorf("first %q cause %q hint %q: want the seccomp filter named", e.First, e.Cause, e.Hint)
	}
}

// In a user namespace CRIU's kernel probe logs that it cannot create a tun
// device and carries on: the first real error is the one after it.
func TestHintSkipsTunProbe(t *testing.T) {
	body := "(00.003093) Error (criu/tun.c:85): tun: Unable to create tun: Permission denied\n" +
		"(00.180315) Error (criu/sockets.c:495): sockets: Unable to set socket SO_SNDBUFFORCE/SO_RCVBUFFORCE: Operation not permitted\n" +
		"(00.180900) Error (criu/cr-restore.c:2331): Restoring FAILED.\n"
	log := filepath.Join(t.TempDir(), "restore.log")
	if err := os.WriteFile(log, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if e := newError("restore", log, "", nil); !strings.Contains(e.First, "SO_SNDBUFFORCE") {
		t.Errorf("first %q: want the socket's buffer sizes", e.First)
	}
}
