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
