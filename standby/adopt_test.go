package standby

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// plant starts sleep as uid, init of a PID namespace of its own, carrying
// the marker of dir: what a copy of the service looks like.
func plant(t *testing.T, dir string, uid uint32) proc {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.Env = []string{markerEnv + "=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return proc{PID: cmd.Process.Pid}
}

// found reports whether findCopies(dir, uid) lists p, waiting for the
// planted process's exec.
func found(dir string, uid uint32, p proc) bool {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if slices.ContainsFunc(findCopies(dir, uid), func(q proc) bool { return q.PID == p.PID }) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A process that another uid planted with the marker of a root kcr
// standby's image directory, in a PID namespace of its own, is not a copy
// of the service: kcr standby would adopt it and hand it --listen.
func TestFindCopiesOwnerOnly(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("run as root: the test starts processes as uid 65534")
	}
	dir := t.TempDir()
	fake := plant(t, dir, 65534)
	real := plant(t, dir, 0)
	if !found(dir, 0, real) {
		t.Fatal("a copy of root's service (uid 0) is not found")
	}
	// Once it is found for a --user 65534 service, it has its marker.
	if !found(dir, 65534, fake) {
		t.Fatal("a copy of a --user 65534 service is not found")
	}
	if slices.ContainsFunc(findCopies(dir, 0), func(q proc) bool { return q.PID == fake.PID }) {
		t.Error("a process of uid 65534 is taken for a copy of root's service")
	}
}

// A volume root a group may write (2775, as provisioners make it with an
// fsGroup) is refused with advice kcr standby can follow (no flag it does
// not have); with the sticky bit (3775) it is accepted.
func TestImageDirOnGroupVolume(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("run as root: the volume root is root's")
	}
	vol := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(vol, 0, 2000); err != nil {
		t.Fatal(err)
	}
	os.Chmod(vol, 0o775|os.ModeSetgid)
	_, err := openImageDir(filepath.Join(vol, "img"))
	if err == nil || !strings.Contains(err.Error(), "chmod +t") || strings.Contains(err.Error(), "--allow-untrusted") {
		t.Fatalf("a 2775 volume root: %v, want it refused with the sticky bit as the fix, and no --allow-untrusted", err)
	}
	os.Chmod(vol, 0o775|os.ModeSetgid|os.ModeSticky)
	d, err := openImageDir(filepath.Join(vol, "img"))
	if err != nil {
		t.Fatalf("a 3775 volume root: %v", err)
	}
	d.close()
}
