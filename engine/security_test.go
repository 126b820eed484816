package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestSecurityRestoreCounterNoLinks: the restore counter is never written
// through a link planted in the image, and never into an image directory of
// another uid.
func TestSecurityRestoreCounterNoLinks(t *testing.T) {
	imagetest.NeedRootTo(t, "make a directory of another uid")
	precious := filepath.Join(t.TempDir(), "precious")
	os.WriteFile(precious, []byte("root's\n"), 0o600)

	own := t.TempDir()
	os.Symlink(precious, filepath.Join(own, images.GenerationName))
	if _, err := nextGeneration(own); err == nil {
		t.Error("counter opened through a symlink")
	}

	theirs := filepath.Join(t.TempDir(), "img")
	os.Mkdir(theirs, 0o700)
	os.Symlink(precious, filepath.Join(theirs, images.GenerationName))
	os.Lchown(theirs, 61001, 61001)
	os.Lchown(filepath.Join(theirs, images.GenerationName), 61001, 61001)
	g1, err := nextGeneration(theirs)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := nextGeneration(theirs)
	if err != nil || g2 != g1+1 {
		t.Fatalf("generations %d then %d (%v), want consecutive", g1, g2, err)
	}
	if b, _ := os.ReadFile(precious); string(b) != "root's\n" {
		t.Fatalf("root wrote %q through the image's restores link", b)
	}
}

// TestSecurityRunLogNoLinks: kcr run does not open its log through a
// symlink another user planted (root would append to, or create, the file
// it points at), nor a FIFO.
func TestSecurityRunLogNoLinks(t *testing.T) {
	dir := t.TempDir()
	precious := filepath.Join(dir, "precious")
	os.WriteFile(precious, []byte("root's\n"), 0o600)
	link := filepath.Join(dir, "svc.log")
	os.Symlink(precious, link)
	_, err := Run(context.Background(), RunOptions{Args: []string{"true"}, Log: link, ReadyTimeout: 0})
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("kcr run with a symlinked log: %v, want a refusal naming the symlink", err)
	}
	if b, _ := os.ReadFile(precious); string(b) != "root's\n" {
		t.Errorf("the link's target was written: %q", b)
	}
	fifo := filepath.Join(dir, "fifo.log")
	syscall.Mkfifo(fifo, 0o600)
	if _, err := Run(context.Background(), RunOptions{Args: []string{"true"}, Log: fifo}); err == nil {
		t.Errorf("kcr run with a FIFO log: %v", err)
	}
}
