// Package images owns kcr's on-disk checkpoint image: its directory
// layout, the manifest, atomic writing and integrity checking.
//
// An image is a directory:
//
//	<image>/          mode 0700
//	  manifest.json   mode 0600, written last
//	  manifest.sig    mode 0600, the manifest's ed25519 signature, if signed
//	  criu/           mode 0700, CRIU's image files
//
// Images hold process memory, so every directory is 0700 and every file
// 0600. A [Builder] writes an image into a hidden sibling directory and
// renames it into place only once it is complete, so nothing at the final
// path ever looks like a half-written image. [Open] reads an image back and
// checks every file listed in the manifest against its size and SHA-256.
package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Names and limits of the image layout.
const (
	// Format is the value of the manifest's "format" field.
	Format = "kcr-image"
	// FormatVersion is the newest manifest format this package reads and
	// the one it writes.
	FormatVersion = 1
	// ManifestName is the manifest's file name in the image root.
	ManifestName = "manifest.json"
	// CRIUSubdir is the subdirectory CRIU dumps its image files into.
	CRIUSubdir = "criu"
	// MaxManifestSize bounds how much of manifest.json is read.
	MaxManifestSize = 16 << 20

	// tmpMarker appears in the name of a Builder's temporary directory.
	tmpMarker = ".kcr-tmp-"
	// manifestTmp is where the manifest is written before its rename.
	manifestTmp = ManifestName + ".tmp"

	dirPerm  = 0o700
	filePerm = 0o600
)

// Sentinel errors, matched with [errors.Is]. The errors returned by this
// package are [*Error] values that wrap one of these and carry a precise,
// one-line message naming the problem and the fix.
var (
	// ErrNotExist: the image path does not exist.
	ErrNotExist = errors.New("image does not exist")
	// ErrNotDir: the image path is not a directory.
	ErrNotDir = errors.New("not a directory")
	// ErrEmpty: the image path is an empty directory.
	ErrEmpty = errors.New("empty directory")
	// ErrNotImage: the directory has no manifest, or the manifest is of
	// another format.
	ErrNotImage = errors.New("not a kcr image")
	// ErrIncomplete: the directory is left over from an interrupted
	// checkpoint.
	ErrIncomplete = errors.New("incomplete image")
	// ErrCorruptManifest: manifest.json cannot be parsed or is invalid.
	ErrCorruptManifest = errors.New("corrupt manifest")
	// ErrVersion: the manifest's format version is newer than supported.
	ErrVersion = errors.New("unsupported image format version")
	// ErrMissing: a file listed in the manifest is absent.
	ErrMissing = errors.New("file missing from image")
	// ErrTruncated: a file is shorter than the manifest says.
	ErrTruncated = errors.New("truncated file")
	// ErrCorrupt: a file's content does not match the manifest.
	ErrCorrupt = errors.New("corrupt file")
	// ErrUnsafePath: a path escapes the image or goes through a symlink,
	// or the image contains something other than files and directories.
	ErrUnsafePath = errors.New("unsafe path in image")
	// ErrExists: the destination of a new image is already in use.
	ErrExists = errors.New("destination already exists")
	// ErrTooLarge: an archive's image is larger than the import limit or
	// than the free space at its destination.
	ErrTooLarge = errors.New("image too large")
)

// Error describes why an image was refused.
type Error struct {
	Dir  string // image directory as given by the caller
	Path string // slash-separated file inside the image; empty if about the image as a whole
	Kind error  // one of the Err* sentinels
	Err  error  // underlying cause, or nil

	msg string
}

// Error returns the one-line message.
func (e *Error) Error() string { return "images: " + e.Dir + ": " + e.msg }

// Unwrap returns Kind and, if set, Err, so that [errors.Is] matches both.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func newError(dir, path string, kind, cause error, msg string) *Error {
	return &Error{Dir: dir, Path: path, Kind: kind, Err: cause, msg: msg}
}

// damaged is the fix suggested for any integrity failure.
const damaged = "the image is damaged; take a new checkpoint"

// ioHint suggests a fix for an unexpected I/O error.
func ioHint(err error) string {
	if errors.Is(err, os.ErrPermission) {
		return " (images are accessible only to their owner; run kcr as that user)"
	}
	return ""
}

// ctxReader makes long copies stop promptly when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// hasher hashes files with one reused buffer: a fresh megabyte per file
// cost more than hashing the small files of an image.
type hasher struct{ buf []byte }

func newHasher() *hasher { return &hasher{buf: make([]byte, 256<<10)} }

// sum returns the number of bytes in r and their hex SHA-256.
func (hs *hasher) sum(ctx context.Context, r io.Reader) (int64, string, error) {
	h := sha256.New()
	n, err := io.CopyBuffer(h, ctxReader{ctx, r}, hs.buf)
	if err != nil {
		return n, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// syncFS flushes the file system that holds dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// syncDir fsyncs a directory so that entries created or renamed in it are
// durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// kindOf names a file type for messages.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "special file (" + m.Type().String() + ")"
}

// isTempName reports whether a directory name is a Builder's temporary name.
func isTempName(base string) bool { return strings.Contains(base, tmpMarker) }

// trackReader records the first error of its underlying reader other than
// io.EOF, to tell read errors from write errors in a copy.
type trackReader struct {
	r   io.Reader
	err error
}

func (t *trackReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF && t.err == nil {
		t.err = err
	}
	return n, err
}

var errTooBig = errors.New("file too big")

// readRootFile reads the regular file name from root, refusing a symlink
// (os.Root follows those that stay inside it, O_NOFOLLOW or not) and more
// than limit bytes.
func readRootFile(root *os.Root, name string, limit int64) ([]byte, error) {
	lfi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !lfi.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("a %s, not a regular file", kindOf(lfi.Mode()))}
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !os.SameFile(fi, lfi) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("replaced while being opened")}
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errTooBig
	}
	return data, nil
}
