package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
)

// stdio is the file name that means stdin or stdout.
const stdio = "-"

func exportCmd(g *globals) *cobra.Command {
	var output, format string
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
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			switch format {
			case "kcr":
			case "cri-o":
				if output == "" || output == stdio {
					return &exitError{exitUsage, errors.New("--format cri-o needs -o FILE.tar")}
				}
				if err := engine.ExportArchive(cmd.Context(), dir, output); err != nil {
					return err
				}
				fmt.Fprintf(stderr, "exported %s to %s (CRI-O checkpoint archive; checkpointctl show reads it)\n", dir, output)
				if g.json {
					return printJSON(map[string]any{"image": dir, "archive": output, "format": format})
				}
				return nil
			case "oci":
				if output == "" || output == stdio {
					return &exitError{exitUsage, errors.New("--format oci needs -o DIR (a new OCI image layout)")}
				}
				if err := engine.ExportOCIImage(cmd.Context(), dir, output); err != nil {
					return err
				}
				fmt.Fprintf(stderr, "exported %s to the OCI layout %s (CRI-O checkpoint image, annotation %s)\n", dir, output, engine.CheckpointAnnotation)
				if g.json {
					return printJSON(map[string]any{"image": dir, "oci_layout": output, "format": format})
				}
				return nil
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
			if output == stdio && g.json {
				return &exitError{exitUsage, errors.New("--json prints on stdout, where -o - writes the archive: drop one of them")}
			}
			if output == stdio && isTerminal(os.Stdout) {
				return &exitError{exitUsage, errors.New("refusing to write a binary archive to a terminal: redirect stdout or use -o FILE")}
			}
			start := time.Now()
			var img *images.Image
			var size int64
			var err error
			if output == stdio {
				cw := &countingWriter{w: os.Stdout}
				img, err = exportStream(cmd, dir, cw)
				size = cw.n
			} else {
				img, size, err = images.ExportFile(cmd.Context(), dir, output)
			}
			if err != nil {
				return err
			}
			took := time.Since(start)
			name := output
			if output == stdio {
				name = "stdout"
			}
			imgSize := img.Size()
			fmt.Fprintf(stderr, "exported %s to %s in %s\n", dir, name, fmtDur(took))
			fmt.Fprintf(stderr, "  image                %s in %d files (verified)\n", fmtSize(imgSize), len(img.Manifest.Files))
			fmt.Fprintf(stderr, "  archive              %s (%s of the image)\n", fmtSize(size), ratio(size, imgSize))
			for _, w := range img.Warnings {
				fmt.Fprintln(stderr, "kcr: warning: "+w)
			}
			if g.json {
				return printJSON(map[string]any{"image": dir, "archive": output, "image_bytes": imgSize, "archive_bytes": size,
					"files": len(img.Manifest.Files), "duration_ns": took.Nanoseconds(), "warnings": img.Warnings})
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "archive file to create, or - for stdout (default ./IMAGE"+images.ArchiveExt+")")
	cmd.Flags().StringVar(&format, "format", "kcr", "kcr; for a container image (kcr checkpoint --container): cri-o, a CRI-O checkpoint archive (config.dump, spec.dump, checkpoint/), or oci, an OCI image layout with CRI-O's checkpoint annotation")
	return cmd
}

// exportStream exports to a stream; the image is read back for the sizes.
func exportStream(cmd *cobra.Command, dir string, w io.Writer) (*images.Image, error) {
	if err := images.Export(cmd.Context(), dir, w); err != nil {
		return nil, err
	}
	m, err := images.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	return &images.Image{Dir: dir, Manifest: m}, nil
}

func importCmd(g *globals) *cobra.Command {
	var output string
	var keyFiles []string
	maxSize := images.DefaultMaxImportSize
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Unpack and verify an archive written by \"kcr export\" into a new image directory",
		Long: `Unpack an archive written by "kcr export" into a new image directory, ready for
"kcr restore". Every file is checked against the manifest's size and SHA-256 as
it is unpacked, into a hidden temporary directory renamed into place only once
the whole image is verified: a damaged or tampered archive leaves nothing behind.
Checksums only catch damage: whoever wrote the archive chose them. With
--verify-key, the manifest must be signed by one of the given keys, checked before
anything is unpacked (exit 9 otherwise): this is how an image is trusted across hosts.
FILE "-" reads the archive from stdin (then -o is required).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file := args[0]
			if output == "" {
				output = defaultImportDir(file)
				if output == "" {
					return &exitError{exitUsage, fmt.Errorf("cannot name the image after %q: pass -o DIR", file)}
				}
			}
			if maxSize <= 0 {
				return &exitError{exitUsage, fmt.Errorf("--max-size %d: give a positive number of bytes", maxSize)}
			}
			keys, err := loadVerifyKeys(keyFiles)
			if err != nil {
				return err
			}
			opts := []images.ImportOption{images.WithMaxSize(maxSize), images.WithVerifyKeys(keys)}
			start := time.Now()
			var img *images.Image
			var size int64
			if file == stdio {
				cr := &countingReader{r: os.Stdin}
				img, err = images.Import(cmd.Context(), cr, output, opts...)
				size = cr.n
			} else {
				img, err = images.ImportFile(cmd.Context(), file, output, opts...)
				if fi, serr := os.Stat(file); serr == nil {
					size = fi.Size()
				}
			}
			if err != nil {
				return err
			}
			took := time.Since(start)
			name := file
			if file == stdio {
				name = "stdin"
			}
			imgSize := img.Size()
			fmt.Fprintf(stderr, "imported %s to %s in %s\n", name, img.Dir, fmtDur(took))
			fmt.Fprintf(stderr, "  archive              %s\n", fmtSize(size))
			fmt.Fprintf(stderr, "  image                %s in %d files (verified; archive is %s of it)\n", fmtSize(imgSize), len(img.Manifest.Files), ratio(size, imgSize))
			signedBy := ""
			if img.Signer != nil {
				signedBy = images.Fingerprint(img.Signer)
				fmt.Fprintf(stderr, "  signature            verified: signed by %s\n", signedBy)
			}
			if g.json {
				return printJSON(map[string]any{"image": img.Dir, "archive": file, "image_bytes": imgSize, "archive_bytes": size,
					"files": len(img.Manifest.Files), "duration_ns": took.Nanoseconds(), "signed_by": signedBy})
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "image directory to create (default: FILE's name without "+images.ArchiveExt+", in the current directory)")
	cmd.Flags().Int64Var(&maxSize, "max-size", maxSize, "largest image, in bytes, to unpack (the free space is checked too)")
	verifyKeyFlag(cmd.Flags(), &keyFiles)
	return cmd
}

// defaultImportDir names the image after the archive: img.tar.zst → img.
func defaultImportDir(file string) string {
	if file == stdio {
		return ""
	}
	base := filepath.Base(file)
	for _, ext := range []string{images.ArchiveExt, ".tzst", ".zst", ".tar"} {
		if s, ok := strings.CutSuffix(base, ext); ok {
			base = s
			break
		}
	}
	if base == "" || base == "." || base == ".." || base == filepath.Base(file) {
		return ""
	}
	return base
}

func ratio(part, whole int64) string {
	if whole <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(whole))
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
