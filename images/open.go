package images

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
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
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	im := &Image{Dir: dir, Manifest: m}
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

// verify checks the files on disk against the manifest: first sizes and
// types, which is cheap, then content hashes.
func (im *Image) verify(ctx context.Context, useCache, trusted bool, keys []ed25519.PublicKey) error {
	dir := im.Dir
	// os.Root keeps every access inside the image even if a path or a
	// symlink in it points elsewhere.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	im.root = root
	if trusted {
		if err := checkAncestors(dir); err != nil {
			return err
		}
	}

	if len(keys) > 0 {
		if err := im.verifySigned(root, keys); err != nil {
			return err
		}
	}

	onDisk := make(map[string]fs.FileInfo)
	var loose []string // group- or other-accessible entries
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info() // lstat: symlinks are not followed
		if err != nil {
			return err
		}
		onDisk[p] = fi
		if fi.Mode().Type() != fs.ModeSymlink && fi.Mode().Perm()&0o077 != 0 {
			loose = append(loose, fmt.Sprintf("%s mode %04o", p, fi.Mode().Perm()))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("images: %s: list image: %w%s", dir, err, ioHint(err))
	}
	if trusted {
		for _, p := range slices.Sorted(maps.Keys(onDisk)) {
			if err := checkOwner(dir, p, onDisk[p], false); err != nil {
				return err
			}
		}
	}

	listed := make(map[string]bool, len(im.Manifest.Files))
	for _, f := range im.Manifest.Files {
		listed[f.Path] = true
		if err := checkEntry(dir, f, onDisk); err != nil {
			return err
		}
	}
	var cache map[string]fileID
	if useCache && ownedByMe(root) {
		// Another user's directory may hold a cache that vouches for
		// files it changed; only a cache this uid wrote is believed.
		cache = readVerified(root)
	}
	hashed, ids := 0, make(map[string]fileID, len(im.Manifest.Files))
	hs := newHasher()
	now := time.Now()
	for _, f := range im.Manifest.Files {
		before, ok := idOf(onDisk[f.Path], f.SHA256)
		if ok && cache[f.Path] == before {
			im.Cached++
			ids[f.Path] = before
			continue
		}
		if err := checkContent(ctx, hs, root, dir, f); err != nil {
			return err
		}
		hashed++
		// Vouch only for a file that did not change while it was hashed,
		// nor shortly before (see VerifiedName).
		if after, ok2 := statID(dir, f.Path, f.SHA256); ok && ok2 && after == before && before.quiet(now) {
			ids[f.Path] = before
		}
	}
	if hashed > 0 && len(ids) > 0 {
		writeVerified(root, ids)
	}

	for p, fi := range onDisk {
		if !fi.IsDir() && !IsReserved(p) && !listed[p] {
			im.Extra = append(im.Extra, p)
		}
	}
	slices.Sort(im.Extra)
	if len(keys) > 0 {
		// CRIU opens optional images when they exist, so a file in its
		// directory that the signed manifest does not list would change
		// the restore without touching the signature.
		for _, x := range im.Extra {
			if strings.HasPrefix(x, CRIUSubdir+"/") && x != criuRestoreStats {
				return newError(dir, x, ErrSignature, nil, fmt.Sprintf(
					"%s is not listed in the signed %s, and CRIU could read it: refusing the image; remove it if you know where it came from", x, ManifestName))
			}
		}
	}
	if len(loose) > 0 {
		slices.Sort(loose)
		im.Warnings = append(im.Warnings, fmt.Sprintf(
			"%d entries are accessible to group or others (e.g. %s) but images hold process memory: run chmod -R go-rwx %s",
			len(loose), loose[0], dir))
	}
	return nil
}

// verifySigned reads the manifest and its signature through root, checks
// the signature against keys and makes those signed bytes the manifest the
// files are checked against.
func (im *Image) verifySigned(root *os.Root, keys []ed25519.PublicKey) error {
	raw, err := readRootFile(root, ManifestName, MaxManifestSize)
	if errors.Is(err, errTooBig) {
		return manifestTooBig(im.Dir)
	}
	if err != nil {
		return fmt.Errorf("images: %s: read %s: %w%s", im.Dir, ManifestName, err, ioHint(err))
	}
	sig, err := readRootFile(root, SignatureName, maxSigFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		sig = nil
	case errors.Is(err, errTooBig):
		sig = []byte("too big")
	case err != nil:
		return newError(im.Dir, SignatureName, ErrSignature, err,
			fmt.Sprintf("%s cannot be read (%v): refusing the image", SignatureName, err))
	}
	pub, err := verifySignature(im.Dir, raw, sig, keys)
	if err != nil {
		return err
	}
	m, err := decodeManifest(im.Dir, raw)
	if err != nil {
		return err
	}
	im.Manifest, im.Signer = m, pub
	return nil
}

// checkEntry checks that f is a regular file of the recorded size, not
// reached through a symlink.
func checkEntry(dir string, f FileEntry, onDisk map[string]fs.FileInfo) error {
	parts := strings.Split(f.Path, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, ok := onDisk[p]
		if !ok || (i < len(parts)-1 && !fi.IsDir() && fi.Mode().Type() != fs.ModeSymlink) {
			return newError(dir, f.Path, ErrMissing, nil,
				fmt.Sprintf("%s is missing (listed in %s); %s", f.Path, ManifestName, damaged))
		}
		if fi.Mode().Type() == fs.ModeSymlink {
			return newError(dir, f.Path, ErrUnsafePath, nil,
				fmt.Sprintf("%s is a symlink: refusing to follow it out of the image; %s", p, damaged))
		}
	}
	fi := onDisk[f.Path]
	switch {
	case !fi.Mode().IsRegular():
		return newError(dir, f.Path, ErrCorrupt, nil,
			fmt.Sprintf("%s is corrupt: a %s, not a regular file; %s", f.Path, kindOf(fi.Mode()), damaged))
	case fi.Size() != f.Size:
		return sizeError(dir, f, fi.Size())
	}
	return nil
}

// checkContent hashes f and compares it with the manifest.
func checkContent(ctx context.Context, hs *hasher, root *os.Root, dir string, f FileEntry) error {
	file, err := root.Open(filepath.FromSlash(f.Path))
	if errors.Is(err, fs.ErrNotExist) {
		return newError(dir, f.Path, ErrMissing, err,
			fmt.Sprintf("%s is missing (listed in %s); %s", f.Path, ManifestName, damaged))
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	defer file.Close()
	n, sum, err := hs.sum(ctx, file)
	if err != nil {
		return fmt.Errorf("images: %s: read %s: %w%s", dir, f.Path, err, ioHint(err))
	}
	if n != f.Size {
		return sizeError(dir, f, n)
	}
	if !strings.EqualFold(sum, f.SHA256) {
		return newError(dir, f.Path, ErrCorrupt, nil,
			fmt.Sprintf("%s is corrupt: sha256 mismatch; %s", f.Path, damaged))
	}
	return nil
}

func sizeError(dir string, f FileEntry, got int64) error {
	kind, what := ErrTruncated, "truncated"
	if got > f.Size {
		kind, what = ErrCorrupt, "corrupt"
	}
	return newError(dir, f.Path, kind, nil,
		fmt.Sprintf("%s is %s: %d bytes, manifest says %d; %s", f.Path, what, got, f.Size, damaged))
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
