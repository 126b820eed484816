package standby

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// listenPrivate's socket is 0600 at its path, answers there, and leaves
// nothing else behind in the directory.
func TestListenPrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, controlSocketName)
	ln, err := listenPrivate(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v, mode %v; want a 0600 socket", err, fi.Mode())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries, want the socket only", len(ents))
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the renamed socket: %v", err)
	}
	c.Close()
}
