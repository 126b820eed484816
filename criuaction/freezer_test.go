package criuaction

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProc writes /proc/42/cgroup and /proc/self/mountinfo under a temp
// root whose cgroup mounts live under the same root.
func fakeProc(t *testing.T, cgroup string, mounts ...string) (procRoot, sys string) {
	t.Helper()
	root := t.TempDir()
	procRoot, sys = filepath.Join(root, "proc"), filepath.Join(root, "sys")
	for _, d := range []string{"42", "self"} {
		if err := os.MkdirAll(filepath.Join(procRoot, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(procRoot, "42", "cgroup"), []byte(cgroup), 0o644)
	var mi []string
	for _, m := range mounts {
		mi = append(mi, strings.ReplaceAll(m, "SYS", sys))
	}
	os.WriteFile(filepath.Join(procRoot, "self", "mountinfo"), []byte(strings.Join(mi, "\n")+"\n"), 0o644)
	return procRoot, sys
}

const (
	mountV1Freezer = "30 25 0:27 / SYS/freezer rw,relatime shared:12 - cgroup cgroup rw,freezer"
	mountV1Memory  = "31 25 0:28 / SYS/memory rw,relatime shared:13 - cgroup cgroup rw,memory"
	mountV2        = "32 25 0:29 / SYS/unified rw,relatime shared:14 - cgroup2 cgroup2 rw"
)

func TestFindFreezerHybridPrefersV1(t *testing.T) {
	proc, sys := fakeProc(t, "6:freezer:/k8s.io/abc\n4:memory:/k8s.io/abc\n0::/k8s.io/abc\n", mountV1Memory, mountV1Freezer, mountV2)
	f, err := findFreezer(proc, 42)
	if err != nil || f == nil {
		t.Fatalf("findFreezer: %v, %v", f, err)
	}
	if want := filepath.Join(sys, "freezer/k8s.io/abc/freezer.state"); f.file != want || f.v2 {
		t.Fatalf("freezer %+v, want v1 %s", f, want)
	}
}

func TestFindFreezerV2(t *testing.T) {
	proc, sys := fakeProc(t, "0::/kubepods/pod1/ctr\n", mountV2)
	f, err := findFreezer(proc, 42)
	if err != nil || f == nil || !f.v2 || f.file != filepath.Join(sys, "unified/kubepods/pod1/ctr/cgroup.freeze") {
		t.Fatalf("findFreezer: %+v, %v", f, err)
	}
}

func TestFindFreezerStaysUnderTheMount(t *testing.T) {
	proc, sys := fakeProc(t, "6:freezer:/../../etc\n", mountV1Freezer)
	f, err := findFreezer(proc, 42)
	if err != nil || f == nil || !strings.HasPrefix(f.file, filepath.Join(sys, "freezer")+"/") {
		t.Fatalf("findFreezer: %+v, %v: want a file under the freezer mount", f, err)
	}
}

// TestThawForHooks: a frozen v1 cgroup is thawed for the hooks and frozen
// again after them; one that is not frozen is left alone.
func TestThawForHooks(t *testing.T) {
	proc, sys := fakeProc(t, "6:freezer:/ctr\n", mountV1Freezer)
	state := filepath.Join(sys, "freezer/ctr/freezer.state")
	os.MkdirAll(filepath.Dir(state), 0o755)
	os.WriteFile(state, []byte("FROZEN\n"), 0o644)
	refreeze, err := thawForHooks(proc, 42, time.Second)
	if err != nil || refreeze == nil {
		t.Fatalf("thawForHooks on a frozen cgroup: %v (refreeze %v)", err, refreeze != nil)
	}
	if b, _ := os.ReadFile(state); strings.TrimSpace(string(b)) != "THAWED" {
		t.Fatalf("state during the hooks %q, want THAWED", b)
	}
	if err := refreeze(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(state); strings.TrimSpace(string(b)) != "FROZEN" {
		t.Fatalf("state after the hooks %q, want FROZEN", b)
	}
	os.WriteFile(state, []byte("THAWED\n"), 0o644)
	if refreeze, err := thawForHooks(proc, 42, time.Second); err != nil || refreeze != nil {
		t.Fatalf("thawForHooks on a running cgroup: %v, refreeze %v; want nothing done", err, refreeze != nil)
	}
}

// TestThawForHooksRootCgroup: a process in a root cgroup (no freezer.state)
// is not frozen.
func TestThawForHooksRootCgroup(t *testing.T) {
	proc, _ := fakeProc(t, "6:freezer:/\n", mountV1Freezer)
	if refreeze, err := thawForHooks(proc, 42, time.Second); err != nil || refreeze != nil {
		t.Fatalf("thawForHooks in the root cgroup: %v, refreeze %v", err, refreeze != nil)
	}
}
