package container

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/kcr-dev/kcr/images"
)

// SignatureEntry is the name, in a CRI-O checkpoint archive written by
// Export with FormatCRIO, of the kcr manifest's signature
// (images.SignatureName); the manifest itself is kcr-manifest.json.
const SignatureEntry = images.CRIOSignatureName

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
		img, n, err = exportArchive(ctx, o.Image, o.Output)
	case FormatOCI:
		img, n, err = exportOCIImage(ctx, o.Image, o.Output)
	default:
		return nil, fmt.Errorf("export format %q: give %s, %s or %s", o.Format, FormatKCR, FormatCRIO, FormatOCI)
	}
	if err != nil {
		return nil, err
	}
	return &ExportResult{ImageBytes: img.Size(), Bytes: n, Files: len(img.Manifest.Files),
		Duration: time.Since(start), Warnings: img.Warnings}, nil
}

// exportArchive writes a verified kcr image of a container (kcr checkpoint
// --container) as a checkpoint archive in CRI-O's layout, the one
// checkpointctl reads: config.dump, spec.dump (the bundle's OCI spec,
// marked as CRI-O's) and CRIU's files under checkpoint/. The archive is
// published by images.WriteNewFile: never partial, never over a file. It returns the
// image, closed, and the archive's size.
func exportArchive(ctx context.Context, image, out string) (*images.Image, int64, error) {
	img, err := images.OpenForExport(ctx, image)
	if err != nil {
		return nil, 0, err
	}
	defer img.Close()
	if err := writeArchive(ctx, img, image, out); err != nil {
		return nil, 0, err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return nil, 0, fmt.Errorf("export: %w", err)
	}
	return img, fi.Size(), nil
}

// writeArchive is exportArchive once the image is open. Everything is read
// through the directory Open verified, and every file checked again as it
// is archived: the image may belong to someone who could swap a file for a
// link to one of root's.
func writeArchive(ctx context.Context, img *images.Image, image, out string) error {
	var c struct{ ID, Bundle string }
	cb, err := img.ReadRootFile(containerBundleFile)
	if err != nil {
		return fmt.Errorf("%s is not a container image (no %s): only images of kcr checkpoint --container", image, containerBundleFile)
	}
	if c.ID, c.Bundle, err = parseContainerFile(image, cb); err != nil {
		return err
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
		return fmt.Errorf("container %s: no readable spec %s: %v", c.ID, specFile, err)
	}
	ann, _ := spec["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	meta, _ := json.Marshal(map[string]string{"name": c.ID})
	created := img.Manifest.Created.Format(time.RFC3339Nano)
	ann["io.container.manager"] = "cri-o"
	ann["io.kubernetes.cri-o.Metadata"] = string(meta)
	ann["io.kubernetes.cri-o.Created"] = created
	spec["annotations"] = ann
	specDump, _ := json.Marshal(spec)
	configDump, _ := json.Marshal(map[string]any{"id": c.ID, "name": c.ID, "runtime": "runc",
		"createdTime": img.Manifest.Created, "checkpointedTime": img.Manifest.Created})

	return images.WriteNewFile(ctx, out, func(f *os.File) error {
		return writeTar(ctx, img, f, configDump, specDump)
	})
}

// writeTar writes the CRI-O archive's entries to w.
func writeTar(ctx context.Context, img *images.Image, w io.Writer, configDump, specDump []byte) error {
	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: img.Manifest.Created}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("config.dump", configDump); err != nil {
		return err
	}
	if err := add("spec.dump", specDump); err != nil {
		return err
	}
	mb, err := img.ReadRootFile(images.ManifestName)
	if err != nil {
		return err
	}
	if err := add(images.CRIOManifestName, mb); err != nil {
		return err
	}
	// The signature goes along, so that whoever unpacks the archive can
	// check who wrote the image.
	if sig, err := img.ReadRootFile(images.SignatureName); err == nil {
		if err := add(SignatureEntry, sig); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("export: %w", err)
	}
	// kcr's own files beside the manifest, so that kcr restore verifies
	// the whole image from the archive.
	for _, name := range []string{containerBundleFile, containerSpecFile} {
		data, err := img.ReadRootFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if err := add(name, data); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: images.CRIOCheckpointDir + "/", Mode: 0o700, ModTime: img.Manifest.Created}); err != nil {
		return err
	}
	for _, e := range img.Manifest.Files {
		if path.Dir(e.Path) != images.CRIUSubdir {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		src, err := img.OpenListed(e)
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Name: images.CRIOCheckpointDir + "/" + path.Base(e.Path), Mode: 0o600, Size: e.Size, ModTime: img.Manifest.Created})
		}
		if err == nil {
			_, err = io.Copy(tw, src)
		}
		if src != nil {
			src.Close()
		}
		if err != nil {
			return fmt.Errorf("export %s: %w", e.Path, err)
		}
	}
	return tw.Close()
}
