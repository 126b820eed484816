package engine

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kcr-dev/kcr/images"
)

// TestSecurityRestoreCounterNoLinks: the restore counter is never written
// through a link planted in the image, and never into an image directory of
// another uid.
func TestSecurityRestoreCounterNoLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to make a directory of another uid")
		}
		t.Skip("needs root to make a directory of another uid")
	}
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

// TestSecurityContainerRestoreUntrusted: as root, kcr restore --container
// refuses an image another uid owns before runc is run, as kcr restore
// does (it used to open it without the check).
func TestSecurityContainerRestoreUntrusted(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to make a directory of another uid")
		}
		t.Skip("needs root to make a directory of another uid")
	}
	img := filepath.Join(t.TempDir(), "img")
	b, err := images.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(b.CRIUDir(), "inventory.img"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(b.Dir(), containerBundleFile), []byte(`{"id":"c","bundle":"/nonexistent"}`), 0o600)
	if _, err := b.Commit(context.Background(), &images.Manifest{}); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(img, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 61001, 61001) })
	ran := filepath.Join(t.TempDir(), "ran")
	runtime := filepath.Join(t.TempDir(), "runc")
	os.WriteFile(runtime, []byte("#!/bin/sh\ntouch "+ran+"\nexit 1\n"), 0o700)
	_, err = RestoreContainer(context.Background(), ContainerOptions{ID: "c", Image: img, Runtime: runtime})
	if !errors.Is(err, images.ErrUntrusted) {
		t.Fatalf("restore --container of uid 61001's image: %v, want ErrUntrusted", err)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("runc was run for an untrusted image")
	}
	if _, err := RestoreContainer(context.Background(), ContainerOptions{ID: "c", Image: img, Runtime: runtime, AllowUntrusted: true}); errors.Is(err, images.ErrUntrusted) {
		t.Errorf("AllowUntrusted: still refused: %v", err)
	}
}

// TestExportArchiveCarriesSignature: the CRI-O archive of a signed
// container image holds the manifest and its signature as they are in the
// image, and CRIU's files as the manifest lists them.
func TestExportArchiveCarriesSignature(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "k")
	if _, err := images.GenerateKeyFiles(prefix, ""); err != nil {
		t.Fatal(err)
	}
	key, err := images.LoadPrivateKey(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	img := containerImage(t, key)
	out := filepath.Join(dir, "c.tar")
	if _, err := Export(context.Background(), ExportOptions{Image: img, Format: FormatCRIO, Output: out}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[hdr.Name], _ = io.ReadAll(tr)
	}
	for name, file := range map[string]string{
		"kcr-manifest.json": images.ManifestName, SignatureEntry: images.SignatureName,
		"checkpoint/pages-1.img": "criu/pages-1.img", "checkpoint/inventory.img": "criu/inventory.img",
	} {
		want, _ := os.ReadFile(filepath.Join(img, file))
		if !bytes.Equal(got[name], want) || len(want) == 0 {
			t.Errorf("archive entry %s: %d bytes, want the image's %s (%d bytes)", name, len(got[name]), file, len(want))
		}
	}
}
