package engine

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestWriteOCILayout: the hand-written layout reads back with
// go-containerregistry, which checks every digest, size and diff id; the
// manifest carries CRI-O's annotation and the layer holds the archive.
func TestWriteOCILayout(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "checkpoint.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, name := range []string{"config.dump", "checkpoint/inventory.img"} {
		body := []byte("contents of " + name)
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write(body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	out := filepath.Join(dir, "oci")
	if err := writeOCILayout(context.Background(), out, archive, "web-1"); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index manifest: %v, %d manifests", err, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("image: %v", err)
	}
	m, _ := img.Manifest()
	if got := m.Annotations[CheckpointAnnotation]; got != "web-1" {
		t.Errorf("annotation = %q, want web-1", got)
	}
	cf, _ := img.ConfigFile()
	if cf.Architecture != runtime.GOARCH || cf.OS != runtime.GOOS {
		t.Errorf("platform %s/%s, want %s/%s", cf.OS, cf.Architecture, runtime.GOOS, runtime.GOARCH)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if len(names) != 2 || names[1] != "checkpoint/inventory.img" {
		t.Errorf("layer holds %v", names)
	}
}
