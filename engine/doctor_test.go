package engine

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestKdatCacheNote(t *testing.T) {
	if _, ok := kdatCacheNote(unix.TMPFS_MAGIC); ok {
		t.Error("a tmpfs /run got a note")
	}
	c, ok := kdatCacheNote(unix.EXT4_SUPER_MAGIC)
	if !ok || !strings.Contains(c.Detail, "/run/criu.kdat") || !c.OK {
		t.Errorf("ext4 /run: %+v, %v; want an informational note naming /run/criu.kdat", c, ok)
	}
}

// A root kcr without CAP_SYS_PTRACE cannot open a userfaultfd when
// vm.unprivileged_userfaultfd is 0, so every --lazy restore fails
// (measured: "criu lazy-pages failed", the service started cold): kcr
// doctor says so.
func TestLazyCapNote(t *testing.T) {
	ptrace := uint64(1) << unix.CAP_SYS_PTRACE
	if _, ok := lazyCapNote(ptrace, false); ok {
		t.Error("CAP_SYS_PTRACE held: got a note")
	}
	if _, ok := lazyCapNote(0, true); ok {
		t.Error("vm.unprivileged_userfaultfd=1: got a note")
	}
	c, ok := lazyCapNote(0, false)
	if !ok || !c.OK || !strings.Contains(c.Detail, "CAP_SYS_PTRACE") || !strings.Contains(c.Detail, "--lazy") {
		t.Errorf("without CAP_SYS_PTRACE: %+v, %v; want an informational note naming CAP_SYS_PTRACE and --lazy", c, ok)
	}
}
