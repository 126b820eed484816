package engine

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
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
	checkOpenOCILayer(t, out, archive)
}

// checkOpenOCILayer: kcr's own reader gives back the archive; a layer
// changed after the export fails at its end; a digest naming a path is
// refused.
func checkOpenOCILayer(t *testing.T, layoutDir, archive string) {
	t.Helper()
	want, _ := os.ReadFile(archive)
	rc, err := openOCILayer(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("openOCILayer: %d bytes, %v; want the %d-byte archive", len(got), err, len(want))
	}
	if _, err := blobPath(layoutDir, ociDescriptor{Digest: "sha256:../../../etc/passwd"}); err == nil {
		t.Error("a digest naming a path was accepted")
	}
	blobs, _ := filepath.Glob(filepath.Join(layoutDir, "blobs", "sha256", "*"))
	for _, b := range blobs {
		data, _ := os.ReadFile(b)
		if len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
			continue // not the gzipped layer
		}
		// Same gzip stream, one byte of the trailer's CRC flipped: still
		// readable by size, wrong digest.
		data[len(data)-8] ^= 0xff
		os.WriteFile(b, data, 0o644)
		rc, err := openOCILayer(layoutDir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(rc)
		rc.Close()
		if err == nil {
			t.Error("a changed layer read back without error")
		}
	}
}
