package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kcr-dev/kcr/images"
)

// Export formats, the values of kcr export --format.
const (
	// FormatKCR is kcr's own zstd archive (images.Export), for kcr import.
	FormatKCR = "kcr"
	// FormatCRIO is a CRI-O checkpoint archive of a container image.
	FormatCRIO = "cri-o"
	// FormatOCI is an OCI image layout holding the CRI-O archive.
	FormatOCI = "oci"
)

// ExportOptions configures Export.
type ExportOptions struct {
	Image  string // the kcr image to export
	Format string // FormatKCR (the default), FormatCRIO or FormatOCI
	// Output is the file (FormatKCR, FormatCRIO) or the new directory
	// (FormatOCI) to write; it must not exist.
	Output string
	// Stdout, with FormatKCR, receives the archive instead of Output.
	Stdout io.Writer
	// BaseImage, with FormatCRIO and FormatOCI, is the image the container
	// ran (NAME:TAG or NAME@DIGEST), which containerd and CRI-O restore
	// the checkpoint onto. Default: the one the container's spec names
	// (containerd's and CRI-O's annotations), else none, and the archive
	// restores only with kcr.
	BaseImage string
}

// ExportResult is what an export read and wrote, whatever the format.
type ExportResult struct {
	ImageBytes int64         // the image's files, as its manifest lists them
	Bytes      int64         // written: the archive, or every file of the OCI layout
	Files      int           // files the manifest lists
	Duration   time.Duration // verification and writing
	Warnings   []string      // the verification's (images.Image.Warnings)
}

// Export verifies o.Image and writes it in o.Format. Nothing is left at
// o.Output unless the export is complete.
func Export(ctx context.Context, o ExportOptions) (*ExportResult, error) {
	start := time.Now()
	var img *images.Image
	var c images.CRIOContainer
	var n int64
	var err error
	switch o.Format {
	case FormatKCR, "":
		if o.Stdout != nil {
			img, n, err = images.Export(ctx, o.Image, o.Stdout)
		} else {
			img, n, err = images.ExportFile(ctx, o.Image, o.Output)
		}
	case FormatCRIO:
		img, c, n, err = exportArchive(ctx, o.Image, o.Output, o.BaseImage)
	case FormatOCI:
		img, c, n, err = exportOCIImage(ctx, o.Image, o.Output, o.BaseImage)
	default:
		return nil, fmt.Errorf("export format %q: give %s, %s or %s", o.Format, FormatKCR, FormatCRIO, FormatOCI)
	}
	if err != nil {
		return nil, err
	}
	if (o.Format == FormatCRIO || o.Format == FormatOCI) && c.BaseImage == "" {
		img.Warnings = append(img.Warnings, "the container's spec names no image: containerd and CRI-O restore this checkpoint only with --base-image NAME (the image it ran); kcr restore --container needs none")
	}
	return &ExportResult{ImageBytes: img.Size(), Bytes: n, Files: len(img.Manifest.Files),
		Duration: time.Since(start), Warnings: img.Warnings}, nil
}

// exportArchive writes a verified kcr image of a container (kcr checkpoint
// --container) as a checkpoint archive in CRI-O's layout, the one
// checkpointctl, CRI-O and containerd read: config.dump, spec.dump (the
// bundle's OCI spec, marked as CRI-O's), status.dump (criContainer) and
// CRIU's files under checkpoint/. The archive is published by
// images.WriteNewFile: never partial, never over a file. It returns the
// image, closed, the container the archive describes, and the archive's
// size.
func exportArchive(ctx context.Context, image, out, base string) (*images.Image, images.CRIOContainer, int64, error) {
	img, err := images.OpenForExport(ctx, image)
	if err != nil {
		return nil, images.CRIOContainer{}, 0, err
	}
	defer img.Close()
	c, err := writeArchive(ctx, img, image, out, base)
	if err != nil {
		return nil, c, 0, err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return nil, c, 0, fmt.Errorf("export: %w", err)
	}
	return img, c, fi.Size(), nil
}

// writeArchive is exportArchive once the image is open. Everything is read
// through the directory Open verified, and every file checked again as it
// is archived: the image may belong to someone who could swap a file for a
// link to one of root's.
func writeArchive(ctx context.Context, img *images.Image, image, out, base string) (images.CRIOContainer, error) {
	var c struct{ ID, Bundle string }
	cb, err := img.ReadRootFile(containerBundleFile)
	if err != nil {
		return images.CRIOContainer{}, fmt.Errorf("%s is not a container image (no %s): only images of kcr checkpoint --container", image, containerBundleFile)
	}
	if c.ID, c.Bundle, err = parseContainerFile(image, cb); err != nil {
		return images.CRIOContainer{}, err
	}
	var spec map[string]any
	// The spec checkpointed with the image; images of an older kcr have
	// only the bundle's current one.
	specFile := filepath.Join(img.Dir, containerSpecFile)
	sb, err := img.ReadRootFile(containerSpecFile)
	if errors.Is(err, fs.ErrNotExist) {
		// The image is trusted (OpenForExport); the bundle must be too,
		// or root would export whatever file that spec path names.
		specFile = filepath.Join(c.Bundle, "config.json")
		sb, err = images.ReadTrustedFile(specFile, images.MaxManifestSize, bundleFix)
	}
	if err != nil || json.Unmarshal(sb, &spec) != nil {
		return images.CRIOContainer{}, fmt.Errorf("container %s: no readable spec %s: %v", c.ID, specFile, err)
	}
	cc, err := criContainer(c.ID, spec, base)
	if err != nil {
		return cc, err
	}
	// kcr's own files beside the manifest, so that kcr restore verifies
	// the whole image from the archive.
	return cc, images.WriteCRIOFile(ctx, img, out, cc, spec, containerBundleFile, containerSpecFile)
}
