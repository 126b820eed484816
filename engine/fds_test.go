package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A program Run starts gets the descriptors handed to it (ExtraFiles, as fd
// 3) and none that kcr inherited without close-on-exec: inside a mount
// namespace of its own, CRIU could not dump such a file.
func TestRunNoInheritedFDs(t *testing.T) {
	dir := t.TempDir()
	inherited := filepath.Join(dir, "inherited-by-kcr")
	// As a shell leaves one to its children: open without O_CLOEXEC, at a
	// number no one else uses.
	fd, err := unix.Open(inherited, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	const high = 200
	if err := unix.Dup3(fd, high, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	t.Cleanup(func() { unix.Close(high) })
	handed, err := os.Create(filepath.Join(dir, "handed-to-service"))
	if err != nil {
		t.Fatal(err)
	}
	defer handed.Close()

	log := filepath.Join(dir, "ls.log")
	// AllCaps: the descriptors do not depend on it, and a confined start
	// can leave the thread it confined (this binary's main one, maybe)
	// parked without capabilities, which TestRunCapabilities would see.
	res, err := Run(context.Background(), RunOptions{Args: []string{"ls", "-l", "/proc/self/fd/"}, Log: log, ExtraFiles: []*os.File{handed}, AllCaps: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ps := <-res.Exited:
		if !ps.Success() {
			t.Fatalf("ls: %v", ps)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ls did not exit within 30s")
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if strings.Contains(out, inherited) {
		t.Errorf("the program got a descriptor kcr inherited:\n%s", out)
	}
	if !strings.Contains(out, " 3 -> "+handed.Name()) {
		t.Errorf("the program did not get its ExtraFiles as fd 3:\n%s", out)
	}
}
