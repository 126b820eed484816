package images

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestVerifiedCache(t *testing.T) {
	ctx := context.Background()
	img := build(t)
	n := len(testFiles)

	// Commit hashed everything: the first Open need not.
	im, err := Open(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if im.Cached != n {
		t.Fatalf("Cached = %d after commit, want %d", im.Cached, n)
	}
	for _, x := range im.Extra {
		if x == VerifiedName {
			t.Fatal("the cache is reported as an extra file")
		}
	}
	if fi, err := os.Stat(filepath.Join(img, VerifiedName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache file: %v %v", fi, err)
	}
	if im, err := OpenRehash(ctx, img); err != nil || im.Cached != 0 {
		t.Fatalf("OpenRehash: cached %d, %v; want everything hashed", im.Cached, err)
	}

	// A byte flipped in place with the modification time put back is still
	// found: the change time moved.
	writeInPlace(t, filepath.Join(img, "criu", "pages-1.img"))
	if _, err := Open(ctx, img); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open after a sneaky write: %v, want ErrCorrupt", err)
	}
}

// noQuiet lets the cache vouch for files just written.
func noQuiet(t *testing.T) {
	old := cacheQuiet
	cacheQuiet = 0
	t.Cleanup(func() { cacheQuiet = old })
}

func TestVerifiedCacheRefreshed(t *testing.T) {
	ctx := context.Background()
	noQuiet(t)
	img := build(t)
	// A damaged cache is ignored, everything is hashed and the cache is
	// written again.
	if err := os.WriteFile(filepath.Join(img, VerifiedName), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	im, err := Open(ctx, img)
	if err != nil || im.Cached != 0 {
		t.Fatalf("Open with a damaged cache: cached %d, %v", im.Cached, err)
	}
	if im, err = Open(ctx, img); err != nil || im.Cached != len(testFiles) {
		t.Fatalf("second Open: cached %d, %v; want the cache rewritten", im.Cached, err)
	}
	// A file replaced by another with the same content gets a new inode:
	// hashed again, and still fine.
	p := filepath.Join(img, "criu", "core-1.img")
	data, _ := os.ReadFile(p)
	os.Remove(p)
	os.WriteFile(p, data, 0o600)
	if im, err = Open(ctx, img); err != nil || im.Cached != len(testFiles)-1 {
		t.Fatalf("after replacing a file: cached %d, %v; want it hashed again", im.Cached, err)
	}
}

// TestVerifiedCacheSkipsRecentFiles: a file changed within cacheQuiet may
// still change through a shared mapping without its times moving, so the
// cache does not vouch for it.
func TestVerifiedCacheSkipsRecentFiles(t *testing.T) {
	ctx := context.Background()
	img := build(t)
	p := filepath.Join(img, "criu", "core-1.img")
	data, _ := os.ReadFile(p)
	os.Remove(p)
	os.WriteFile(p, data, 0o600)
	for range 2 {
		im, err := Open(ctx, img)
		if err != nil || im.Cached != len(testFiles)-1 {
			t.Fatalf("Open: cached %d, %v; want the fresh file hashed every time", im.Cached, err)
		}
	}
}

// TestVerifiedCacheKeyHasDevice: an entry from another device does not match.
func TestVerifiedCacheKeyHasDevice(t *testing.T) {
	ctx := context.Background()
	img := build(t)
	root, err := os.OpenRoot(img)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ids := readVerified(root)
	for k, v := range ids {
		v.Dev++
		ids[k] = v
	}
	writeVerified(root, ids)
	if im, err := Open(ctx, img); err != nil || im.Cached != 0 {
		t.Fatalf("Open with entries of another device: cached %d, %v", im.Cached, err)
	}
}

// An image held open reports a file written after it was verified, even
// one written in place with its times put back.
func TestUnchanged(t *testing.T) {
	ctx := context.Background()
	img := build(t)
	im, err := Open(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if err := im.Unchanged(); err != nil {
		t.Fatalf("Unchanged right after Open: %v", err)
	}
	writeInPlace(t, filepath.Join(img, "criu", "pages-1.img"))
	if err := im.Unchanged(); err == nil || !strings.Contains(err.Error(), "criu/pages-1.img changed") {
		t.Fatalf("Unchanged after a write: %v, want criu/pages-1.img changed", err)
	}
}

// writeInPlace changes a byte of the file at p and puts its modification
// time back: only its change time shows the write.
func writeInPlace(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0x00}, 7)
	f.Close()
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
}
