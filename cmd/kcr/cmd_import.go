package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/images"
)

// importOpts are import's arguments and flags.
type importOpts struct {
	cmdline
	output   string
	keyFiles []string
	maxSize  int64
}

func importCmd(g *globals) *cobra.Command {
	var opts importOpts
	opts.maxSize = images.DefaultMaxImportSize
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
		RunE: runE(g, &opts, runImport),
	}
	cmd.Flags().StringVarP(&opts.output, "output", "o", "", "image directory to create (default: FILE's name without "+images.ArchiveExt+", in the current directory)")
	cmd.Flags().Int64Var(&opts.maxSize, "max-size", opts.maxSize, "largest image, in bytes, to unpack (the free space is checked too)")
	verifyKeyFlag(cmd.Flags(), &opts.keyFiles)
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

// isTerminalWriter reports whether w is a terminal (an *os.File that is one).
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
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

// importJSON is kcr import --json's one shape.
type importJSON struct {
	Image        string `json:"image"`
	Archive      string `json:"archive"` // "-": stdin
	ImageBytes   int64  `json:"image_bytes"`
	ArchiveBytes int64  `json:"archive_bytes"`
	Files        int    `json:"files"`
	DurationNS   int64  `json:"duration_ns"`
	SignedBy     string `json:"signed_by"`
}

// runImport runs kcr import: results on out's stdout, the report on its stderr.
func runImport(ctx context.Context, opts *importOpts, out *output) error {
	args := opts.args
	output, keyFiles, maxSize := opts.output, opts.keyFiles, opts.maxSize
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
	iopts := []images.ImportOption{images.WithMaxSize(maxSize), images.WithVerifyKeys(keys)}
	start := time.Now()
	var img *images.Image
	var size int64
	if file == stdio {
		cr := &countingReader{r: os.Stdin}
		img, err = images.Import(ctx, cr, output, iopts...)
		size = cr.n
	} else {
		img, err = images.ImportFile(ctx, file, output, iopts...)
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
	fmt.Fprintf(out.stderr, "imported %s to %s in %s\n", name, img.Dir, fmtDur(took))
	fmt.Fprintf(out.stderr, "  archive              %s\n", fmtSize(size))
	fmt.Fprintf(out.stderr, "  image                %s in %d files (verified; archive is %s of it)\n", fmtSize(imgSize), len(img.Manifest.Files), ratio(size, imgSize))
	signedBy := ""
	if img.Signer != nil {
		signedBy = images.Fingerprint(img.Signer)
		fmt.Fprintf(out.stderr, "  signature            verified: signed by %s\n", signedBy)
	}
	if out.json {
		return out.JSON(importJSON{Image: img.Dir, Archive: file, ImageBytes: imgSize, ArchiveBytes: size,
			Files: len(img.Manifest.Files), DurationNS: took.Nanoseconds(), SignedBy: signedBy})
	}
	return nil
}
