package engine

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
)

// CheckpointAnnotation is the annotation by which CRI-O recognises a
// checkpoint image; its value is the checkpointed container's name.
const CheckpointAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"

// OCI media types of the image layout ExportOCIImage writes.
const (
	ociIndexType    = "application/vnd.oci.image.index.v1+json"
	ociManifestType = "application/vnd.oci.image.manifest.v1+json"
	ociConfigType   = "application/vnd.oci.image.config.v1+json"
	ociLayerType    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// ociDescriptor is an OCI content descriptor.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// ExportOCIImage writes a container image of kcr (kcr checkpoint
// --container) as an OCI image layout in dir: one gzipped layer holding the
// CRI-O checkpoint archive's files, the manifest carrying
// CheckpointAnnotation. Push it with any OCI tool (skopeo copy oci:DIR
// docker://REGISTRY/NAME).
//
// The layout is written by hand (index, manifest, config, one layer): an
// OCI library would link its package init (digest and reference regexps)
// into every kcr start, for one command.
func ExportOCIImage(ctx context.Context, image, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("export: %s exists: give a new directory", dir)
	}
	name, _, err := readContainerFile(image)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".kcr-oci-")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer os.RemoveAll(tmp)
	archive := filepath.Join(tmp, "checkpoint.tar")
	if err := ExportArchive(ctx, image, archive); err != nil {
		return err
	}
	out := filepath.Join(tmp, "oci")
	if err := writeOCILayout(ctx, out, archive, name); err != nil {
		return err
	}
	return os.Rename(out, dir)
}

// writeOCILayout writes the OCI image layout out (a new directory) with the
// tar file archive as its one layer and CheckpointAnnotation set to name.
func writeOCILayout(ctx context.Context, out, archive, name string) error {
	blobs := filepath.Join(out, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	layer, diffID, err := writeLayer(ctx, blobs, archive)
	if err != nil {
		return fmt.Errorf("export: layer: %w", err)
	}
	config, err := writeBlob(blobs, ociConfigType, map[string]any{
		"architecture": runtime.GOARCH, // CRIU images restore on the architecture they were dumped on
		"os":           runtime.GOOS,
		"config":       map[string]any{},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return fmt.Errorf("export: config: %w", err)
	}
	manifest, err := writeBlob(blobs, ociManifestType, map[string]any{
		"schemaVersion": 2,
		"mediaType":     ociManifestType,
		"config":        config,
		"layers":        []ociDescriptor{layer},
		"annotations":   map[string]string{CheckpointAnnotation: name},
	})
	if err != nil {
		return fmt.Errorf("export: manifest: %w", err)
	}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": ociIndexType, "manifests": []ociDescriptor{manifest}})
	if err := os.WriteFile(filepath.Join(out, "index.json"), index, 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// writeLayer gzips the tar file src into blobs and returns its descriptor
// and its diff id (the digest of the uncompressed tar).
func writeLayer(ctx context.Context, blobs, src string) (ociDescriptor, string, error) {
	in, err := os.Open(src)
	if err != nil {
		return ociDescriptor{}, "", err
	}
	defer in.Close()
	f, err := os.CreateTemp(blobs, ".layer-")
	if err != nil {
		return ociDescriptor{}, "", err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	defer f.Close()
	if err := ctx.Err(); err != nil {
		return ociDescriptor{}, "", err
	}
	sum, diff := sha256.New(), sha256.New()
	zw, _ := gzip.NewWriterLevel(io.MultiWriter(f, sum), gzip.BestSpeed)
	if _, err := io.Copy(io.MultiWriter(zw, diff), in); err != nil {
		return ociDescriptor{}, "", err
	}
	if err := zw.Close(); err != nil {
		return ociDescriptor{}, "", err
	}
	fi, err := f.Stat()
	if err != nil {
		return ociDescriptor{}, "", err
	}
	if err := f.Close(); err != nil {
		return ociDescriptor{}, "", err
	}
	d := ociDescriptor{MediaType: ociLayerType, Digest: digest(sum), Size: fi.Size()}
	if err := os.Rename(f.Name(), filepath.Join(blobs, d.Digest[len("sha256:"):])); err != nil {
		return ociDescriptor{}, "", err
	}
	return d, digest(diff), nil
}

// writeBlob writes v as JSON into blobs and returns its descriptor.
func writeBlob(blobs, mediaType string, v any) (ociDescriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ociDescriptor{}, err
	}
	h := sha256.Sum256(b)
	d := ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(h[:]), Size: int64(len(b))}
	return d, os.WriteFile(filepath.Join(blobs, hex.EncodeToString(h[:])), b, 0o644)
}

func digest(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }
