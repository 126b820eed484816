package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Commit takes Prehash's hash of a file left as it was, and hashes again
// one written since: the manifest is right either way, and the image opens.
func TestPrehash(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	if err := os.MkdirAll(b.CRIUDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	kept, changed := []byte("pages kept"), []byte("pages before")
	for name, data := range map[string][]byte{"pages-1.img": kept, "pages-2.img": changed} {
		if err := os.WriteFile(filepath.Join(b.CRIUDir(), name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Prehash(context.Background(), []string{CRIUSubdir + "/pages-1.img", CRIUSubdir + "/pages-2.img"}); err != nil {
		t.Fatal(err)
	}
	// Same size, later modification time.
	time.Sleep(10 * time.Millisecond)
	changed = []byte("pages after!")
	if err := os.WriteFile(filepath.Join(b.CRIUDir(), "pages-2.img"), changed, 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{}
	if _, err := b.Commit(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{CRIUSubdir + "/pages-1.img": sumOf(kept), CRIUSubdir + "/pages-2.img": sumOf(changed)}
	for _, f := range m.Files {
		if w, ok := want[f.Path]; ok && f.SHA256 != w {
			t.Errorf("%s: sha256 %s, want %s", f.Path, f.SHA256, w)
		}
		delete(want, f.Path)
	}
	if len(want) != 0 {
		t.Errorf("not in the manifest: %v", want)
	}
	if _, err := Open(context.Background(), final); err != nil {
		t.Errorf("open: %v", err)
	}
}

// A cancelled Prehash returns at once with the context's error.
func TestPrehashCanceled(t *testing.T) {
	b, err := Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	if err := os.MkdirAll(b.CRIUDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.CRIUDir(), "pages-1.img"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Prehash(ctx, []string{CRIUSubdir + "/pages-1.img"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Prehash after cancel: %v, want context.Canceled", err)
	}
}
