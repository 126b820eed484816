package images

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Image is an image that has been read and verified.
type Image struct {
	// Dir is the image directory.
	Dir string
	// Manifest is the image's parsed manifest.
	Manifest *Manifest
	// Extra lists files on disk that the manifest does not, sorted. They
	// are ignored; CRIU, for one, writes stats-restore at restore time.
	Extra []string
	// Warnings lists problems that do not prevent using the image, such
	// as permissions wider than 0700/0600.
	Warnings []string
	// Cached counts the files that were not hashed again because they are
	// unchanged since they were last verified.
	Cached int
	// verified identifies each file as it was verified (Unchanged).
	verified map[string]fileID
	// Signer is the key whose signature of the manifest was verified (see
	// OpenOptions.VerifyKeys); nil when no key was asked for.
	Signer ed25519.PublicKey

	root *os.Root // the directory verified; see CRIUDirFile
}

// criuRestoreStats is the one file CRIU itself adds to an image directory,
// at restore time.
const criuRestoreStats = CRIUSubdir + "/stats-restore"

// CRIUDir returns the directory holding CRIU's image files.
func (im *Image) CRIUDir() string { return filepath.Join(im.Dir, CRIUSubdir) }

// Size returns the total size of the files listed in the manifest.
func (im *Image) Size() int64 { return im.Manifest.TotalSize() }

// Open reads the image in dir and verifies it: every file listed in the
// manifest must exist inside the image, as a regular file not reached
// through a symlink, with the recorded size and SHA-256. Errors wrap the
// package's sentinel errors. Hashing stops early when ctx is done.
//
// Files unchanged on disk since they were last hashed (see VerifiedName)
// are not hashed again; OpenRehash hashes everything.
func Open(ctx context.Context, dir string) (*Image, error) {
	return OpenWith(ctx, dir, OpenOptions{})
}

// OpenRehash is Open without the verification cache: every file is hashed.
func OpenRehash(ctx context.Context, dir string) (*Image, error) {
	return OpenWith(ctx, dir, OpenOptions{Rehash: true})
}

// OpenOptions configures OpenWith.
type OpenOptions struct {
	// Rehash hashes every file, ignoring the verification cache.
	Rehash bool
	// VerifyKeys, if not empty, requires the image to carry a signature of
	// its manifest (SignatureName) by one of these keys, else ErrSignature.
	// The manifest is then read once, through the directory verified, and
	// the files are checked against those signed bytes.
	VerifyKeys []ed25519.PublicKey
	// Trusted refuses (ErrUntrusted) an image that a user other than the
	// caller's effective user or root could have written: the directory,
	// an entry in it or an ancestor owned by another uid, or writable by
	// group or others (an ancestor may be a sticky directory of root's, as
	// /tmp). CRIU running as root recreates the credentials and memory an
	// image describes, so such an image gives its writer root's powers.
	Trusted bool
}

// OpenWith is Open with options. The image keeps the directory it verified
// open: [Image.CRIUDirFile] hands that same directory to CRIU, so that the
// path cannot be swapped for another between verification and restore.
// Close releases it.
func OpenWith(ctx context.Context, dir string, o OpenOptions) (*Image, error) {
	// The owner check comes first; then everything is read once, through
	// the directory's fd.
	root, err := openImageRoot(dir)
	if err != nil {
		return nil, err
	}
	im := &Image{Dir: dir, root: root}
	if o.Trusted {
		if err := checkAncestors(dir); err != nil {
			im.Close()
			return nil, err
		}
		fi, err := root.Lstat(".")
		if err == nil {
			err = checkOwner(dir, ".", fi, false)
		}
		if err != nil {
			im.Close()
			return nil, err
		}
	}
	if im.Manifest, err = readManifestRoot(dir, root); err != nil {
		im.Close()
		return nil, err
	}
	if err := im.verify(ctx, !o.Rehash, o.Trusted, o.VerifyKeys); err != nil {
		im.Close()
		return nil, err
	}
	return im, nil
}

// Close releases the directory the image was verified through.
func (im *Image) Close() error {
	if im.root == nil {
		return nil
	}
	err := im.root.Close()
	im.root = nil
	return err
}

// CRIUDirFile opens CRIU's image directory inside the directory that Open
// verified, for CRIU to read through its descriptor. The caller closes it.
func (im *Image) CRIUDirFile() (*os.File, error) {
	if im.root == nil {
		return nil, fmt.Errorf("images: %s: image is not open", im.Dir)
	}
	f, err := im.root.OpenFile(CRIUSubdir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", im.Dir, err, ioHint(err))
	}
	return f, nil
}

// ReadRootFile reads a small regular file (at most MaxManifestSize bytes)
// of the image root, such as the manifest or its signature, through the
// directory Open verified and not through a symlink.
func (im *Image) ReadRootFile(name string) ([]byte, error) {
	if im.root == nil {
		return nil, fmt.Errorf("images: %s: image is not open", im.Dir)
	}
	b, err := readRootFile(im.root, name, MaxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("images: %s: read %s: %w%s", im.Dir, name, err, ioHint(err))
	}
	return b, nil
}

// OpenListed opens f, a file the manifest lists, through the directory
// Open verified. Its reader checks the content again as it is read: a read
// that reaches the end of a file that changed since it was verified fails
// with ErrCorrupt or ErrTruncated instead of returning io.EOF.
func (im *Image) OpenListed(f FileEntry) (io.ReadCloser, error) {
	if im.root == nil {
		return nil, fmt.Errorf("images: %s: image is not open", im.Dir)
	}
	lfi, err := im.root.Lstat(filepath.FromSlash(f.Path))
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", im.Dir, err, ioHint(err))
	}
	if !lfi.Mode().IsRegular() {
		return nil, newError(im.Dir, f.Path, ErrCorrupt, nil,
			fmt.Sprintf("%s is corrupt: a %s, not a regular file; %s", f.Path, kindOf(lfi.Mode()), damaged))
	}
	file, err := im.root.Open(filepath.FromSlash(f.Path))
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", im.Dir, err, ioHint(err))
	}
	if fi, err := file.Stat(); err != nil || !os.SameFile(fi, lfi) {
		file.Close()
		return nil, newError(im.Dir, f.Path, ErrCorrupt, err, fmt.Sprintf("%s was replaced while being opened; %s", f.Path, damaged))
	}
	return &checkedReader{f: file, dir: im.Dir, e: f, h: sha256.New()}, nil
}

// checkedReader hashes what it reads and checks it against e at the end.
type checkedReader struct {
	f   *os.File
	dir string
	e   FileEntry
	h   hash.Hash
	n   int64
}

func (c *checkedReader) Read(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.e.Size+1 {
		p = p[:c.e.Size+1-c.n] // read one byte past the end to catch growth
	}
	n, err := c.f.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if c.n > c.e.Size {
		return n, sizeError(c.dir, c.e, c.n)
	}
	if err == io.EOF {
		if c.n != c.e.Size {
			return n, sizeError(c.dir, c.e, c.n)
		}
		if hex.EncodeToString(c.h.Sum(nil)) != strings.ToLower(c.e.SHA256) {
			return n, newError(c.dir, c.e.Path, ErrCorrupt, nil,
				fmt.Sprintf("%s is corrupt: sha256 mismatch (it changed since it was verified); %s", c.e.Path, damaged))
		}
	}
	return n, err
}

func (c *checkedReader) Close() error { return c.f.Close() }
