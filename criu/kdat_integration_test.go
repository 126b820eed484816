package criu

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountedAt reports whether path is a mount point in this mount namespace.
func mountedAt(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// TestCacheKdat: where /run is not a tmpfs, CRIU loads the probe the cache
// keeps instead of probing the kernel again, and Release leaves /run as it
// found it. Where /run is a tmpfs the cache does nothing.
func TestCacheKdat(t *testing.T) {
	criuPath := needCRIU(t)
	var st unix.Statfs_t
	if err := unix.Statfs("/run", &st); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	existed := false
	if _, err := os.Lstat(KdatPath); err == nil {
		existed = true
	}
	k, err := CacheKdat(context.Background(), criuPath, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Release()
	if st.Type == unix.TMPFS_MAGIC {
		if !k.TmpfsAlready || mountedAt(t, KdatPath) {
			t.Fatalf("/run is a tmpfs: cache %+v, mounted %v; want nothing done", k, mountedAt(t, KdatPath))
		}
		return
	}
	if !mountedAt(t, KdatPath) {
		t.Fatalf("%s is not a mount point", KdatPath)
	}
	kept, err := os.ReadFile(filepath.Join(dir, "criu.kdat"))
	if err != nil || len(kept) == 0 {
		t.Fatalf("probe kept: %d bytes, %v", len(kept), err)
	}
	if seen, err := os.ReadFile(KdatPath); err != nil || !bytes.Equal(seen, kept) {
		t.Fatalf("%s holds %d bytes (%v), want the %d kept", KdatPath, len(seen), err, len(kept))
	}
	log := filepath.Join(dir, "check.log")
	if out, err := exec.Command(criuPath, "check", "-v4", "-o", log).CombinedOutput(); err != nil {
		t.Fatalf("criu check: %v: %s", err, out)
	}
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "Loaded kdat cache from "+KdatPath) {
		t.Fatalf("CRIU probed the kernel again; its log:\n%s", b)
	}
	k.Release()
	if mountedAt(t, KdatPath) {
		t.Fatalf("%s still mounted after Release", KdatPath)
	}
	if _, err := os.Lstat(KdatPath); err == nil && !existed {
		t.Errorf("%s left behind", KdatPath)
	}
}
