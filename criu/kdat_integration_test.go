package criu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCacheKdat: where /run is not a tmpfs, CRIU loads the probe the cache
// keeps instead of probing the kernel again, for as long as one of two
// users holds it; the last Release leaves /run without it. A stale probe
// left mounted (by a kcr that was killed) is replaced. Where /run is a
// tmpfs the cache does nothing.
//
// The test mounts on KdatPath and takes its lock, which every kcr on the
// host shares: it runs in a mount namespace of its own whose /run is a
// private directory, so that it neither disturbs a kcr running beside it
// (the e2e tests, a kcr standby) nor is disturbed by one.
func TestCacheKdat(t *testing.T) {
	criuPath := needCRIU(t)
	if !privateRun(t) {
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/run", &st); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if st.Type == unix.TMPFS_MAGIC {
		k, err := CacheKdat(ctx, criuPath, t.TempDir())
		if err != nil || !k.TmpfsAlready || kdatMounted() {
			t.Fatalf("/run is a tmpfs: cache %+v (%v), mounted %v; want nothing done", k, err, kdatMounted())
		}
		return
	}
	// A stale probe, as a killed kcr of another CRIU build would leave it
	// (over whatever an earlier killed kcr left).
	unmountKdat()
	stale := filepath.Join(t.TempDir(), "stale.kdat")
	if err := os.WriteFile(stale, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err := os.OpenFile(KdatPath, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		f.Close()
	}
	if err := unix.Mount(stale, KdatPath, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	dir1, dir2 := t.TempDir(), t.TempDir()
	k1, err := CacheKdat(ctx, criuPath, dir1)
	if err != nil {
		unmountKdat()
		t.Fatal(err)
	}
	defer k1.Release()
	k2, err := CacheKdat(ctx, criuPath, dir2)
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Release()
	kept, err := os.ReadFile(filepath.Join(dir1, "criu.kdat"))
	if err != nil || len(kept) == 0 {
		t.Fatalf("probe kept: %d bytes, %v", len(kept), err)
	}
	checkLoaded := func(when string) {
		t.Helper()
		if !kdatMounted() {
			t.Fatalf("%s: %s is not a mount point", when, KdatPath)
		}
		if seen, err := os.ReadFile(KdatPath); err != nil || !sameCRIU(seen, kept) {
			t.Fatalf("%s: %s holds %q (%v), want a probe of this CRIU", when, KdatPath, seen[:min(len(seen), 8)], err)
		}
		log := filepath.Join(t.TempDir(), "check.log")
		if out, err := exec.Command(criuPath, "check", "-v4", "-o", log).CombinedOutput(); err != nil {
			t.Fatalf("%s: criu check: %v: %s", when, err, out)
		}
		if b, _ := os.ReadFile(log); !strings.Contains(string(b), "Loaded kdat cache from "+KdatPath) {
			t.Fatalf("%s: CRIU probed the kernel again; its log:\n%s", when, b)
		}
	}
	checkLoaded("two users")
	k1.Release()
	checkLoaded("one released, the other still using it")
	k2.Release()
	if kdatMounted() {
		t.Fatalf("%s still mounted after the last Release", KdatPath)
	}
	if _, err := os.Lstat(KdatPath); err == nil {
		t.Errorf("%s left behind", KdatPath)
	}
}

// privateRun re-runs the calling test in a mount namespace of its own with a
// private directory on /run, and reports false in the caller, whose run
// ended; in that re-run it mounts the directory and reports true.
func privateRun(t *testing.T) bool {
	const env = "KCR_TEST_PRIVATE_RUN"
	if dir := os.Getenv(env); dir != "" {
		// The host's mounts on KdatPath, copied into this namespace,
		// would still be listed under the new /run: detach them here
		// (only here: the file under them is the host's).
		for unix.Unmount(KdatPath, unix.MNT_DETACH) == nil {
		}
		if err := unix.Mount(dir, "/run", "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mounting %s on /run: %v", dir, err)
		}
		return true
	}
	dir, err := os.MkdirTemp("/var/tmp", "kcr-test-run-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private",
		os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, err := cmd.CombinedOutput()
	t.Logf("in a mount namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("%s in a mount namespace of its own: %v", t.Name(), err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s did not pass in a mount namespace of its own", t.Name())
	}
	return false
}
