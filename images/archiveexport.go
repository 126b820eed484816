package images

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Export verifies the image in dir with [Open] and writes it to w as a
// zstd-compressed tar stream: manifest.json first, then every file the
// manifest lists, in order. Files are hashed again as they are archived,
// so a file changed since the verification is refused rather than
// exported. On error, what was written to w is not a valid archive.
//
// It returns the verified image, already closed (its Manifest and Warnings
// stay), and the archive's size in bytes.
func Export(ctx context.Context, dir string, w io.Writer) (*Image, int64, error) {
	cw := &countWriter{w: w}
	im, err := export(ctx, dir, cw)
	if err != nil {
		return nil, 0, err
	}
	return im, cw.n, nil
}

// exportFix is the advice when root refuses to export an image.
const exportFix = "as root, kcr export would vouch for what that user wrote (the archive comes out root's, and passes the checks): run kcr export as that user, or chown -R root: the image and chmod -R go-w it if you trust that user"

// OpenForExport opens and verifies the image in dir to export it: as
// root, it refuses (ErrUntrusted) an image another user owns or could have
// written, as OpenOptions.Trusted does.
func OpenForExport(ctx context.Context, dir string) (*Image, error) {
	if _, err := os.Lstat(dir); err == nil && os.Geteuid() == 0 {
		if _, err := checkTree(dir, exportFix); err != nil {
			return nil, err
		}
	}
	return OpenWith(ctx, dir, OpenOptions{Trusted: os.Geteuid() == 0})
}

// export is Export without the count; the image it returns is closed.
func export(ctx context.Context, dir string, w io.Writer) (*Image, error) {
	im, err := OpenForExport(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer im.Close() // export reads through a root of its own
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	defer root.Close()
	raw, m, err := exportedManifest(root, dir, im)
	if err != nil {
		return nil, err
	}
	sig, signed, err := exportedSignature(root, dir)
	if err != nil {
		return nil, err
	}

	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return nil, fmt.Errorf("images: %s: zstd: %w", dir, err)
	}
	// On error zw is deliberately not closed: the partial output must not
	// end like a complete zstd stream. Its goroutines end with each block.
	tw := tar.NewWriter(zw)
	// Every entry gets the checkpoint's time and no owner, so exporting
	// an image twice gives the same archive.
	mtime := m.Created.Truncate(time.Second)
	header := func(name string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: filePerm, ModTime: mtime}
	}
	writeErr := func(err error) error {
		return fmt.Errorf("images: %s: write archive: %w%s", dir, err, ioHint(err))
	}
	if err := writeEntry(tw, header(ManifestName, int64(len(raw))), raw); err != nil {
		return nil, writeErr(err)
	}
	// The signature, if any, travels second, so that an import can check
	// it before it unpacks anything.
	if signed {
		if err := writeEntry(tw, header(SignatureName, int64(len(sig))), sig); err != nil {
			return nil, writeErr(err)
		}
	}
	buf := make([]byte, 1<<20)
	for _, f := range m.Files {
		if err := exportFile(ctx, root, dir, f, tw, header(f.Path, f.Size), buf); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, writeErr(err)
	}
	if err := zw.Close(); err != nil {
		return nil, writeErr(err)
	}
	return im, nil
}

// exportedManifest reads the manifest's exact bytes to archive them, and
// makes sure they are the ones Open verified in im.
func exportedManifest(root *os.Root, dir string, im *Image) ([]byte, *Manifest, error) {
	raw, err := readRootFile(root, ManifestName, MaxManifestSize)
	if errors.Is(err, errTooBig) {
		return nil, nil, manifestTooBig(dir)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("images: %s: read %s: %w%s", dir, ManifestName, err, ioHint(err))
	}
	m, err := decodeManifest(dir, raw)
	if err != nil {
		return nil, nil, err
	}
	if !slices.Equal(m.Files, im.Manifest.Files) {
		return nil, nil, newError(dir, ManifestName, ErrCorruptManifest, nil,
			ManifestName+" changed while exporting: is something rewriting this image? export it again")
	}
	return raw, m, nil
}

// exportedSignature reads the image's signature to archive it; signed is
// false when the image has none.
func exportedSignature(root *os.Root, dir string) (sig []byte, signed bool, err error) {
	sig, err = readRootFile(root, SignatureName, maxSigFile)
	switch {
	case err == nil:
		return sig, true, nil
	case errors.Is(err, errTooBig):
		return nil, false, newError(dir, SignatureName, ErrSignature, nil,
			fmt.Sprintf("%s is larger than %d bytes, not a kcr signature: remove it or sign the image again", SignatureName, maxSigFile))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("images: %s: read %s: %w%s", dir, SignatureName, err, ioHint(err))
	}
	return nil, false, nil
}

// writeEntry appends one entry of the archive, its header and its bytes.
func writeEntry(tw *tar.Writer, h *tar.Header, data []byte) error {
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// exportFile appends f to the archive, checking it against the manifest
// as it goes.
func exportFile(ctx context.Context, root *os.Root, dir string, f FileEntry, tw *tar.Writer, hdr *tar.Header, buf []byte) error {
	file, err := root.Open(filepath.FromSlash(f.Path))
	if errors.Is(err, fs.ErrNotExist) {
		return newError(dir, f.Path, ErrMissing, err,
			fmt.Sprintf("%s is missing (listed in %s; it vanished while exporting); %s", f.Path, ManifestName, damaged))
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	defer file.Close()
	if fi, err := file.Stat(); err != nil {
		return fmt.Errorf("images: %s: %w", dir, err)
	} else if !fi.Mode().IsRegular() {
		return newError(dir, f.Path, ErrCorrupt, nil,
			fmt.Sprintf("%s is corrupt: a %s, not a regular file; %s", f.Path, kindOf(fi.Mode()), damaged))
	} else if fi.Size() != f.Size {
		return sizeError(dir, f, fi.Size())
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("images: %s: write archive: %w%s", dir, err, ioHint(err))
	}
	h := sha256.New()
	src := &trackReader{r: ctxReader{ctx, file}}
	n, err := io.CopyBuffer(io.MultiWriter(tw, h), io.LimitReader(src, f.Size), buf)
	if err == nil && src.err == nil && n == f.Size {
		// The file must not have grown either.
		if k, _ := src.Read(buf[:1]); k > 0 {
			n++
		}
	}
	switch {
	case src.err != nil:
		if ctx.Err() != nil {
			return fmt.Errorf("images: %s: export: %w", dir, ctx.Err())
		}
		return fmt.Errorf("images: %s: read %s: %w%s", dir, f.Path, src.err, ioHint(src.err))
	case err != nil:
		return fmt.Errorf("images: %s: write archive: %w%s", dir, err, ioHint(err))
	case n != f.Size:
		return sizeError(dir, f, n)
	case hex.EncodeToString(h.Sum(nil)) != strings.ToLower(f.SHA256):
		return newError(dir, f.Path, ErrCorrupt, nil,
			fmt.Sprintf("%s is corrupt: sha256 mismatch (it changed while exporting); %s", f.Path, damaged))
	}
	return nil
}

// ExportFile exports the image in dir (see [Export]) to a new archive
// file, mode 0600, through [WriteNewFile]: file never holds a partial
// archive and an existing file is never replaced. It returns the verified
// image and the archive's size in bytes.
func ExportFile(ctx context.Context, dir, file string) (*Image, int64, error) {
	if file == "" {
		return nil, 0, fmt.Errorf("images: %s: no archive file name given; pass -o FILE", dir)
	}
	if _, base := filepath.Split(file); base == "" {
		return nil, 0, fmt.Errorf("images: %s: %s names a directory; give a file name such as img%s", dir, file, ArchiveExt)
	}
	var im *Image
	var size int64
	err := WriteNewFile(ctx, file, func(f *os.File) (err error) {
		im, size, err = Export(ctx, dir, f)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return im, size, nil
}

// WriteNewFile creates file, mode 0600, with what write writes to it. It
// writes to a hidden sibling with a unique name, so that a temporary left
// by a killed writer never blocks, and removes it on failure; only once
// write succeeded and the data is synced is it renamed into place,
// without replacing anything: an existing file is refused before and at
// the rename, with an [Error] of kind [ErrExists].
func WriteNewFile(ctx context.Context, file string, write func(*os.File) error) error {
	parent, base := filepath.Split(file)
	if parent == "" {
		parent = "."
	}
	if _, err := os.Lstat(file); err == nil {
		return newError(file, "", ErrExists, nil, "already exists; choose another -o or remove it")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("images: %s: %w%s", file, err, ioHint(err))
	}
	if err := CheckOutputDir(file); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(parent, "."+base+tmpMarker+"*") // mode 0600
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("images: %s: directory %s: %w: create it first", file, filepath.Clean(parent), unix.ENOENT)
		}
		return fmt.Errorf("images: %s: create temporary file: %w%s", file, err, ioHint(err))
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(filePerm); err == nil {
		err = tmp.Sync()
	}
	if err != nil {
		return fmt.Errorf("images: %s: write: %w%s", file, err, ioHint(err))
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("images: %s: write: %w%s", file, err, ioHint(err))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("images: %s: %w", file, err)
	}
	if err := RenameNoReplace(tmp.Name(), file); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return newError(file, "", ErrExists, err, "already exists (created during the export); choose another -o or remove it")
		}
		return fmt.Errorf("images: %s: rename %s into place: %w", file, tmp.Name(), err)
	}
	done = true
	if err := syncDir(parent); err != nil {
		return fmt.Errorf("images: %s: sync directory: %w", file, err)
	}
	return nil
}

// RenameNoReplace renames oldpath, a file or a directory, to newpath
// unless newpath exists (an error satisfying errors.Is(err, fs.ErrExist)).
func RenameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	// The file system lacks RENAME_NOREPLACE. link(2) refuses to replace
	// too; a directory cannot be linked, and rename(2) refuses only a
	// non-empty destination, so an empty one counts as existing.
	fi, err := os.Lstat(oldpath)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if err := os.Link(oldpath, newpath); err != nil {
			return err
		}
		return os.Remove(oldpath)
	}
	if _, err := os.Lstat(newpath); err == nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: unix.EEXIST}
	}
	err = unix.Rename(oldpath, newpath)
	if errors.Is(err, unix.ENOTEMPTY) {
		err = unix.EEXIST
	}
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// CheckOutputDir refuses, as root, to write the new file or directory out
// into a directory that another user owns or can write, or below one
// (see OpenTrustedDir): that user could swap what kcr writes.
func CheckOutputDir(out string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	d, _, err := OpenTrustedDir(filepath.Dir(abs), outputFix)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the caller says which directory to create
	}
	if e, ok := errors.AsType[*Error](err); ok {
		e.Dir = out
		return e
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w", out, err)
	}
	return d.Close()
}
