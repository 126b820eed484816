package standby

import (
	"net"
	"os"
	"path/filepath"
	"strings"
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

// A control socket path that fits a socket address (107 bytes) is bound
// even though the temporary directory it is bound in makes a longer path.
func TestListenPrivateLongPath(t *testing.T) {
	dir := t.TempDir()
	pad := 100 - len(filepath.Join(dir, "x", controlSocketName))
	if pad < 1 {
		t.Fatalf("temporary directory %s too long for this test", dir)
	}
	dir = filepath.Join(dir, strings.Repeat("x", pad))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, controlSocketName)
	ln, err := listenPrivate(path)
	if err != nil {
		t.Fatalf("listen on %s (%d bytes): %v", path, len(path), err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	c.Close()
}
