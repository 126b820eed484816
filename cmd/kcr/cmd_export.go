package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine/container"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/images/oci"
)

// exportOpts are export's arguments and flags.
type exportOpts struct {
	cmdline
	output    string
	format    string
	baseImage string
}

// stdio is the file name that means stdin or stdout.
const stdio = "-"

func exportCmd(g *globals) *cobra.Command {
	var opts exportOpts
	cmd := &cobra.Command{
		Use:   "export IMAGE",
		Short: "Verify an image and write it as one compressed archive file (.tar.zst) to copy to another host",
		Long: `Verify an image and write it as one compressed archive file to copy to another host,
where "kcr import" unpacks and verifies it. The archive is a zstd-compressed tar
holding manifest.json, its signature (manifest.sig) if the image is signed, and
the files the manifest lists, nothing else. It is written to a
temporary file and renamed into place, so FILE is never a partial archive.
"-o -" writes the archive to stdout, e.g. kcr export img -o - | ssh host kcr import - -o img`,
		Args: cobra.ExactArgs(1),
		RunE: runE(g, &opts, runExport),
	}
	cmd.Flags().StringVarP(&opts.output, "output", "o", "", "archive file to create, or - for stdout (default ./IMAGE"+images.ArchiveExt+")")
	cmd.Flags().StringVar(&opts.format, "format", "kcr", "kcr; for a container image (kcr checkpoint --container): cri-o, a checkpoint archive (config.dump, spec.dump, status.dump, checkpoint/) that CRI-O and containerd restore, or oci, an OCI image layout of it with CRI-O's and containerd's checkpoint annotations")
	cmd.Flags().StringVar(&opts.baseImage, "base-image", "", "with --format cri-o or oci: the image the container ran (NAME:TAG or NAME@DIGEST), which containerd and CRI-O restore the checkpoint onto (default: the one containerd or CRI-O recorded in the container's spec)")
	return cmd
}

// exportJSON is kcr export --json's one shape, whatever --format.
type exportJSON struct {
	Image        string   `json:"image"`
	Format       string   `json:"format"`
	Archive      string   `json:"archive"`    // kcr, cri-o: the archive written ("-": stdout)
	OCILayout    string   `json:"oci_layout"` // oci: the layout directory written
	ImageBytes   int64    `json:"image_bytes"`
	ArchiveBytes int64    `json:"archive_bytes"` // written: the archive, or the OCI layout's files
	Files        int      `json:"files"`
	DurationNS   int64    `json:"duration_ns"`
	Warnings     []string `json:"warnings"`
}

// runExport runs kcr export: results on out's stdout, the report on its stderr.
func runExport(ctx context.Context, opts *exportOpts, out *output) error {
	output, format := opts.output, opts.format
	dir := opts.args[0]
	switch format {
	case container.FormatKCR:
	case container.FormatCRIO:
		if output == "" || output == stdio {
			return &exitError{exitUsage, errors.New("--format cri-o needs -o FILE.tar (a tar on stdout would look complete even if the export failed)")}
		}
	case container.FormatOCI:
		if output == "" || output == stdio {
			return &exitError{exitUsage, errors.New("--format oci needs -o DIR (a new OCI image layout)")}
		}
	default:
		return &exitError{exitUsage, fmt.Errorf("--format %q: give kcr, cri-o or oci", format)}
	}
	if output == "" {
		base := filepath.Base(filepath.Clean(dir))
		if base == "." || base == ".." || base == "/" {
			return &exitError{exitUsage, fmt.Errorf("cannot name the archive after %q: pass -o FILE", dir)}
		}
		output = base + images.ArchiveExt
	}
	if output == stdio && out.json {
		return &exitError{exitUsage, errors.New("--json prints on stdout, where -o - writes the archive: drop one of them")}
	}
	if output == stdio && isTerminalWriter(out.stdout) {
		return &exitError{exitUsage, errors.New("refusing to write a binary archive to a terminal: redirect stdout or use -o FILE")}
	}
	if opts.baseImage != "" && format == container.FormatKCR {
		return &exitError{exitUsage, errors.New("--base-image is for --format cri-o or oci (a container runtime's restore): kcr restore needs none")}
	}
	o := container.ExportOptions{Image: dir, Format: format, Output: output, BaseImage: opts.baseImage}
	name := output
	if output == stdio {
		o.Output, o.Stdout, name = "", out.stdout, "stdout"
	}
	res, err := container.Export(ctx, o)
	if err != nil {
		return err
	}
	written := "archive"
	switch format {
	case container.FormatCRIO:
		name += " (CRI-O checkpoint archive; checkpointctl show reads it)"
	case container.FormatOCI:
		name = "the OCI layout " + name + " (checkpoint image for CRI-O and containerd, annotations " + oci.CheckpointAnnotation + ", " + oci.CRIUAnnotation + ")"
		written = "layout"
	}
	fmt.Fprintf(out.stderr, "exported %s to %s in %s\n", dir, name, fmtDur(res.Duration))
	fmt.Fprintf(out.stderr, "  image                %s in %d files (verified)\n", fmtSize(res.ImageBytes), res.Files)
	fmt.Fprintf(out.stderr, "  %-20s %s (%s of the image)\n", written, fmtSize(res.Bytes), ratio(res.Bytes, res.ImageBytes))
	for _, w := range res.Warnings {
		fmt.Fprintln(out.stderr, "kcr: warning: "+w)
	}
	if out.json {
		doc := exportJSON{Image: dir, Format: format, Archive: output, ImageBytes: res.ImageBytes, ArchiveBytes: res.Bytes,
			Files: res.Files, DurationNS: res.Duration.Nanoseconds(), Warnings: nonNil(res.Warnings)}
		if format == container.FormatOCI {
			doc.Archive, doc.OCILayout = "", output
		}
		return out.JSON(doc)
	}
	return nil
}
