package images

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
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

// verify checks the files on disk against the manifest: first sizes and
// types, which is cheap, then content hashes.
func (im *Image) verify(ctx context.Context, useCache, trusted bool, keys []ed25519.PublicKey) error {
	dir := im.Dir
	// os.Root keeps every access inside the image even if a path or a
	// symlink in it points elsewhere. OpenWith opened it, and checked the
	// ancestors when trusted.
	root := im.root

	if len(keys) > 0 {
		if err := im.verifySigned(root, keys); err != nil {
			return err
		}
	}

	onDisk, loose, err := listImage(ctx, root)
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
	if err := im.checkContents(ctx, root, onDisk, useCache); err != nil {
		return err
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

// listImage lstats every entry of the image (symlinks are not followed), and
// names the ones group or others may access, for the warning.
func listImage(ctx context.Context, root *os.Root) (map[string]fs.FileInfo, []string, error) {
	onDisk := make(map[string]fs.FileInfo)
	var loose []string
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		onDisk[p] = fi
		if fi.Mode().Type() != fs.ModeSymlink && fi.Mode().Perm()&0o077 != 0 {
			loose = append(loose, fmt.Sprintf("%s mode %04o", p, fi.Mode().Perm()))
		}
		return nil
	})
	return onDisk, loose, err
}

// checkContents hashes every listed file that the verification cache does
// not vouch for, and records the ones it may vouch for next time: the cache
// is what lets a restore skip hashing an unchanged image.
func (im *Image) checkContents(ctx context.Context, root *os.Root, onDisk map[string]fs.FileInfo, useCache bool) error {
	dir := im.Dir
	var cache map[string]fileID
	if useCache && ownedByMe(root) {
		// Another user's directory may hold a cache that vouches for
		// files it changed; only a cache this uid wrote is believed.
		cache = readVerified(root)
	}
	hashed, ids := 0, make(map[string]fileID, len(im.Manifest.Files))
	hs := newHasher()
	now := time.Now()
	seen := make(map[string]fileID, len(im.Manifest.Files))
	defer func() {
		if len(seen) == len(im.Manifest.Files) {
			im.verified = seen
		}
	}()
	for _, f := range im.Manifest.Files {
		before, ok := idOf(onDisk[f.Path], f.SHA256)
		if ok {
			seen[f.Path] = before
		}
		if ok && cache[f.Path] == before {
			im.Cached++
			ids[f.Path] = before
			continue
		}
		if err := checkContent(ctx, hs, root, dir, f, onDisk[f.Path]); err != nil {
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

// checkContent hashes f and compares it with the manifest. The file is
// opened without waiting on a FIFO, must be the one listed (lfi), and is
// read no further than one byte past its listed size.
func checkContent(ctx context.Context, hs *hasher, root *os.Root, dir string, f FileEntry, lfi fs.FileInfo) error {
	file, err := root.OpenFile(filepath.FromSlash(f.Path), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return newError(dir, f.Path, ErrMissing, err,
			fmt.Sprintf("%s is missing (listed in %s); %s", f.Path, ManifestName, damaged))
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	defer file.Close()
	if fi, err := file.Stat(); err != nil || !fi.Mode().IsRegular() || (lfi != nil && !os.SameFile(fi, lfi)) {
		return newError(dir, f.Path, ErrCorrupt, err, fmt.Sprintf("%s was replaced while being opened; %s", f.Path, damaged))
	}
	n, sum, err := hs.sum(ctx, io.LimitReader(file, f.Size+1))
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

// Unchanged reports an error unless every file of the manifest is, by its
// inode, size and times, the file that was verified when the image was
// opened: an image held open for a while (a restore prepared ahead) is
// verified again before use if it is not.
func (im *Image) Unchanged() error {
	if im.verified == nil {
		return fmt.Errorf("images: %s: not all files were identified when verified", im.Dir)
	}
	for _, f := range im.Manifest.Files {
		now, ok := statID(im.Dir, f.Path, f.SHA256)
		if !ok || now != im.verified[f.Path] {
			return fmt.Errorf("images: %s: %s changed since it was verified", im.Dir, f.Path)
		}
	}
	return nil
}
