// Package oci writes and reads kcr's OCI checkpoint image: an OCI image
// layout whose one layer is the CRI-O checkpoint archive (images'
// WriteCRIOFile and ImportCRIO), annotated as CRI-O expects. It is apart
// from images so that kcr's CRIU action script, which needs images, does
// not link go-containerregistry.
package oci

import (
	"errors"
	"fmt"
	"io"
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

// CRIUAnnotation is the one by which containerd (checkpointctl's
// CheckpointAnnotationName) recognises a checkpoint image, with the same
// value.
const CRIUAnnotation = "org.criu.checkpoint.container.name"

// WriteLayout writes the new directory dir as an OCI image layout: one
// image, whose one layer holds the files of the CRI-O checkpoint archive
// that writeArchive writes to the path it is given ([images.WriteCRIOFile]), and
// whose manifest carries CheckpointAnnotation and CRIUAnnotation with the
// name writeArchive returns. Push it with any OCI tool (skopeo copy oci:DIR
// docker://REGISTRY/NAME). Nothing is left at dir unless the layout is
// complete. It returns the size of the layout's files.
func WriteLayout(dir string, writeArchive func(archive string) (name string, err error)) (int64, error) {
	if _, err := os.Lstat(dir); err == nil {
		return 0, ociExists(dir)
	}
	if err := images.CheckOutputDir(dir); err != nil {
		return 0, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".kcr-oci-")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("export: %s: directory %s: %w: create it first", dir, filepath.Dir(dir), syscall.ENOENT)
	}
	if err != nil {
		return 0, fmt.Errorf("export: %w", err)
	}
	defer os.RemoveAll(tmp)
	archive := filepath.Join(tmp, "checkpoint.tar")
	name, err := writeArchive(archive)
	if err != nil {
		return 0, err
	}
	layer, err := tarball.LayerFromFile(archive)
	if err != nil {
		return 0, fmt.Errorf("export: layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return 0, fmt.Errorf("export: image: %w", err)
	}
	img = mutate.Annotations(img, map[string]string{CheckpointAnnotation: name, CRIUAnnotation: name}).(v1.Image)
	out := filepath.Join(tmp, "oci")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return 0, fmt.Errorf("export: %w", err)
	}
	if err := p.AppendImage(img); err != nil {
		return 0, fmt.Errorf("export: write image: %w", err)
	}
	// go-containerregistry writes 0755 and 0644; the layer holds process
	// memory, and its blobs and directories are made as private as it.
	if err := privateTree(out); err != nil {
		return 0, fmt.Errorf("export: %w", err)
	}
	size, err := treeSize(out)
	if err != nil {
		return 0, fmt.Errorf("export: %w", err)
	}
	// A directory that appeared during the export, even empty, is kept.
	if err := images.RenameNoReplace(out, dir); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return 0, ociExists(dir)
		}
		return 0, fmt.Errorf("export: %s: %w", dir, err)
	}
	return size, nil
}

// OpenLayout reads the OCI image layout dir that [WriteLayout]
// wrote: its one image carries CheckpointAnnotation, and its one layer is
// the CRI-O archive, which the returned function opens as a stream for
// [images.ImportCRIO].
func OpenLayout(dir string) (func() (io.ReadCloser, error), error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("OCI layout %s holds %d images: give a layout of kcr export --format oci (one checkpoint image)", dir, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 || (m.Annotations[CheckpointAnnotation] == "" && m.Annotations[CRIUAnnotation] == "") {
		return nil, fmt.Errorf("OCI layout %s is not a checkpoint image of kcr export --format oci (want one layer and the %s annotation)", dir, CheckpointAnnotation)
	}
	return func() (io.ReadCloser, error) {
		rc, err := layers[0].Uncompressed()
		if err != nil {
			return nil, fmt.Errorf("OCI layout %s: layer: %w", dir, err)
		}
		return rc, nil
	}, nil
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
