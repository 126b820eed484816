package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// CheckpointAnnotation is the annotation by which CRI-O recognises a
// checkpoint image; its value is the checkpointed container's name.
const CheckpointAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"

// ExportOCIImage writes a container image of kcr (kcr checkpoint
// --container) as an OCI image layout in dir: one layer holding the CRI-O
// checkpoint archive's files, the manifest carrying CheckpointAnnotation.
// Push it with any OCI tool (skopeo copy oci:DIR docker://REGISTRY/NAME).
func ExportOCIImage(ctx context.Context, image, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("export: %s exists: give a new directory", dir)
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
	layer, err := tarball.LayerFromFile(archive)
	if err != nil {
		return fmt.Errorf("export: layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("export: image: %w", err)
	}
	name, _, err := readContainerFile(image)
	if err != nil {
		return err
	}
	img = mutate.Annotations(img, map[string]string{CheckpointAnnotation: name}).(v1.Image)
	out := filepath.Join(tmp, "oci")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := p.AppendImage(img); err != nil {
		return fmt.Errorf("export: write image: %w", err)
	}
	return os.Rename(out, dir)
}
