package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kcr-dev/kcr/images"
)

// CheckpointAnnotation is the annotation by which CRI-O recognises a
// checkpoint image; its value is the checkpointed container's name.
const CheckpointAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"

// exportOCIImage writes a container image of kcr (kcr checkpoint
// --container) as an OCI image layout in dir: one layer holding the CRI-O
// checkpoint archive's files, the manifest carrying CheckpointAnnotation.
// Push it with any OCI tool (skopeo copy oci:DIR docker://REGISTRY/NAME).
// It returns the image, closed, and the size of the layout's files.
func exportOCIImage(ctx context.Context, image, dir string) (*images.Image, int64, error) {
	if _, err := os.Lstat(dir); err == nil {
		return nil, 0, ociExists(dir)
	}
	if err := images.CheckOutputDir(dir); err != nil {
		return nil, 0, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".kcr-oci-")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("export: %s: directory %s: %w: create it first", dir, filepath.Dir(dir), syscall.ENOENT)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("export: %w", err)
	}
	defer os.RemoveAll(tmp)
	archive := filepath.Join(tmp, "checkpoint.tar")
	im, _, err := exportArchive(ctx, image, archive)
	if err != nil {
		return nil, 0, err
	}
	layer, err := tarball.LayerFromFile(archive)
	if err != nil {
		return nil, 0, fmt.Errorf("export: layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, 0, fmt.Errorf("export: image: %w", err)
	}
	name, _, err := readContainerFile(image)
	if err != nil {
		return nil, 0, err
	}
	img = mutate.Annotations(img, map[string]string{CheckpointAnnotation: name}).(v1.Image)
	out := filepath.Join(tmp, "oci")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return nil, 0, fmt.Errorf("export: %w", err)
	}
	if err := p.AppendImage(img); err != nil {
		return nil, 0, fmt.Errorf("export: write image: %w", err)
	}
	// go-containerregistry writes 0755 and 0644; the layer holds process
	// memory, and its blobs and directories are made as private as it.
	if err := privateTree(out); err != nil {
		return nil, 0, fmt.Errorf("export: %w", err)
	}
	size, err := treeSize(out)
	if err != nil {
		return nil, 0, fmt.Errorf("export: %w", err)
	}
	// A directory that appeared during the export, even empty, is kept.
	if err := images.RenameNoReplace(out, dir); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, 0, ociExists(dir)
		}
		return nil, 0, fmt.Errorf("export: %s: %w", dir, err)
	}
	return im, size, nil
}

// ociExists is the error for an OCI layout directory that exists.
func ociExists(dir string) error {
	return fmt.Errorf("export: %s: %w; choose another -o or remove it", dir, images.ErrExists)
}

// treeSize is the total size of the regular files under dir.
func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	return n, err
}

// privateTree makes the directories under dir 0700 and its files 0600.
func privateTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			return os.Chmod(p, 0o700)
		case d.Type().IsRegular():
			return os.Chmod(p, 0o600)
		}
		return fmt.Errorf("%s: a %s in the layout", p, d.Type())
	})
}
