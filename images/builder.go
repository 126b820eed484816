package images

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Builder writes a new image. It works in a temporary sibling of the final
// path, named ".<base>.kcr-tmp-<random>", which [Builder.Commit] renames
// into place. The usual pattern is:
//
//	b, err := images.Create(path)
//	...
//	defer b.Abort()
//	// dump into b.CRIUDir()
//	img, err := b.Commit(ctx, m)
//
// A Builder is not safe for concurrent use.
type Builder struct {
	final string // absolute final path
	tmp   string // absolute temporary root
	done  bool   // committed or aborted

	signer ed25519.PrivateKey // signs the manifest if set
}

// SignWith makes Commit (and Recover) sign the manifest with priv, writing
// SignatureName beside it, so that the image is published signed.
func (b *Builder) SignWith(priv ed25519.PrivateKey) { b.signer = priv }

// Create validates final as the destination of a new image and creates the
// temporary directory to build it in. The parent of final must exist;
// final itself must not exist or must be an empty directory, which Commit
// then replaces.
func Create(final string) (*Builder, error) {
	abs, err := filepath.Abs(final)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", final, err)
	}
	parent, base := filepath.Split(abs)
	parent = filepath.Clean(parent)
	if base == "" {
		return nil, fmt.Errorf("images: %s: cannot use the root directory as an image; choose another -o", final)
	}
	if isTempName(base) {
		return nil, fmt.Errorf("images: %s: name contains %q, which marks incomplete images; choose another -o", final, tmpMarker)
	}
	if pfi, err := os.Stat(parent); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("images: %s: parent directory %s: %w: create it first", final, parent, syscall.ENOENT)
		}
		return nil, fmt.Errorf("images: %s: %w%s", final, err, ioHint(err))
	} else if !pfi.IsDir() {
		return nil, fmt.Errorf("images: %s: parent %s is not a directory; choose another -o", final, parent)
	}
	if err := checkFree(final, abs); err != nil {
		return nil, err
	}

	tmp, err := os.MkdirTemp(parent, "."+base+tmpMarker+"*")
	if err != nil {
		return nil, fmt.Errorf("images: %s: create temporary directory: %w%s", final, err, ioHint(err))
	}
	b := &Builder{final: abs, tmp: tmp}
	// Chmod explicitly: the umask may have narrowed MkdirTemp's 0700.
	if err := os.Chmod(tmp, dirPerm); err == nil {
		err = os.Mkdir(b.CRIUDir(), dirPerm)
	}
	if err == nil {
		err = os.Chmod(b.CRIUDir(), dirPerm)
	}
	if err != nil {
		b.Abort()
		return nil, fmt.Errorf("images: %s: prepare temporary directory: %w", final, err)
	}
	return b, nil
}

// checkFree reports whether abs may become a new image: it must not exist
// or be an empty directory.
func checkFree(final, abs string) error {
	fi, err := os.Lstat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w%s", final, err, ioHint(err))
	}
	if fi.IsDir() {
		d, err := os.Open(abs)
		if err != nil {
			return fmt.Errorf("images: %s: %w%s", final, err, ioHint(err))
		}
		names, _ := d.Readdirnames(1)
		d.Close()
		if len(names) == 0 {
			return nil
		}
	}
	return newError(final, "", ErrExists, nil, "already exists; choose another -o or remove it")
}

// Dir returns the temporary root of the image being built.
func (b *Builder) Dir() string { return b.tmp }

// CRIUDir returns the directory CRIU should dump into.
func (b *Builder) CRIUDir() string { return filepath.Join(b.tmp, CRIUSubdir) }

// Final returns the absolute path the image will have once committed.
func (b *Builder) Final() string { return b.final }

// Commit completes the image: it restricts permissions to 0700/0600,
// records the size and SHA-256 of every file in m.Files, writes
// manifest.json, fsyncs everything and renames the temporary directory to
// the final path. It also fills m.Format, m.FormatVersion and, if zero,
// m.Created. The image contains only regular files and directories;
// anything else is an error. On error the temporary directory is left in
// place for [Builder.Abort].
func (b *Builder) Commit(ctx context.Context, m *Manifest) (*Image, error) {
	if b.done {
		return nil, fmt.Errorf("images: %s: builder already committed or aborted; create a new one", b.final)
	}
	if m == nil {
		return nil, fmt.Errorf("images: %s: commit with nil manifest; pass the checkpoint's manifest", b.final)
	}
	// Writing the dump back to disk and hashing it take about as long as
	// each other; they overlap. publish syncs again, which then only has
	// the manifest and the new modes to write.
	synced := make(chan error, 1)
	go func() { synced <- syncFS(b.tmp) }()
	files, _, err := b.seal(ctx)
	if serr := <-synced; err == nil && serr != nil {
		err = fmt.Errorf("images: %s: sync: %w", b.final, serr)
	}
	if err != nil {
		return nil, err
	}
	m.Format, m.FormatVersion, m.Files = Format, FormatVersion, files
	if m.Created.IsZero() {
		m.Created = time.Now()
	}
	m.Created = m.Created.UTC()
	if err := b.writeManifest(m); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(b.tmp, PendingName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: %s: remove draft manifest: %w", b.final, err)
	}
	if err := b.publish(ctx, "checkpoint"); err != nil {
		return nil, err
	}
	// The files were just hashed in a private directory: the first restore
	// need not read them again.
	ids := make(map[string]fileID, len(files))
	for _, f := range files {
		if id, ok := statID(b.final, f.Path, f.SHA256); ok {
			ids[f.Path] = id
		}
	}
	if root, err := os.OpenRoot(b.final); err == nil && len(ids) == len(files) {
		writeVerified(root, ids)
		root.Close()
	}
	return &Image{Dir: b.final, Manifest: m}, nil
}

// publish makes the temporary directory durable and renames it into place;
// op names what built it, for errors.
func (b *Builder) publish(ctx context.Context, op string) error {
	// One syncfs makes every file, the manifest and the directories durable
	// before the rename publishes them; per-file fsyncs cost a flush each.
	if err := syncFS(b.tmp); err != nil {
		return fmt.Errorf("images: %s: sync: %w", b.final, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("images: %s: %s: %w", b.final, op, err)
	}
	// rename(2), unlike os.Rename, atomically replaces an empty directory
	// and refuses a non-empty one, so a destination that filled up since
	// Create is never clobbered.
	if err := syscall.Rename(b.tmp, b.final); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTDIR) {
			return newError(b.final, "", ErrExists, err, "already exists (created during the "+op+"); choose another -o or remove it")
		}
		return fmt.Errorf("images: %s: rename %s into place: %w", b.final, b.tmp, err)
	}
	b.done = true
	if err := syncDir(filepath.Dir(b.final)); err != nil {
		return fmt.Errorf("images: %s: sync parent directory: %w", b.final, err)
	}
	return nil
}

// seal walks the temporary directory, fixes permissions and hashes and
// fsyncs every file. It returns the file entries sorted by path and the
// directories to fsync.
func (b *Builder) seal(ctx context.Context) ([]FileEntry, []string, error) {
	hs := newHasher()
	files := []FileEntry{} // "files": [] rather than null when empty
	var dirs []string
	err := filepath.WalkDir(b.tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(b.tmp, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			dirs = append(dirs, p)
			return os.Chmod(p, dirPerm)
		case rel == ManifestName || rel == manifestTmp:
			return nil // replaced by writeManifest
		case rel == PendingName:
			return nil // the draft, removed once the manifest is written
		case rel == SignatureName || rel == signatureTmp:
			return nil // written with the manifest
		case !d.Type().IsRegular():
			return newError(b.final, rel, ErrUnsafePath, nil,
				fmt.Sprintf("%s is a %s: images may hold only regular files and directories; remove it", rel, kindOf(d.Type())))
		}
		e, err := sealFile(ctx, hs, p)
		if err != nil {
			return err
		}
		e.Path = rel
		files = append(files, e)
		return nil
	})
	if err != nil {
		if _, ok := errors.AsType[*Error](err); ok {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("images: %s: seal image: %w", b.final, err)
	}
	slices.SortFunc(files, func(a, b FileEntry) int { return strings.Compare(a.Path, b.Path) })
	return files, dirs, nil
}

// sealFile makes p private and hashes it. Commit syncs the file system.
func sealFile(ctx context.Context, hs *hasher, p string) (FileEntry, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return FileEntry{}, err
	}
	defer f.Close()
	if err := f.Chmod(filePerm); err != nil {
		return FileEntry{}, err
	}
	n, sum, err := hs.sum(ctx, f)
	if err != nil {
		return FileEntry{}, fmt.Errorf("hash %s: %w", p, err)
	}
	return FileEntry{Size: n, SHA256: sum}, nil
}

// writeManifest encodes m and writes it as manifest.json.
func (b *Builder) writeManifest(m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("images: %s: encode manifest: %w", b.final, err)
	}
	data = append(data, '\n')
	var sig []byte
	if b.signer != nil {
		sig = signManifest(b.signer, data)
	}
	return b.writeManifestBytes(data, sig)
}

// writeManifestBytes writes data as manifest.json and, if not nil, sig as
// its signature: each to a temporary file, then renamed. Commit and import
// sync them with the rest.
func (b *Builder) writeManifestBytes(data, sig []byte) error {
	if sig != nil {
		if err := b.writeRootFile(signatureTmp, SignatureName, sig); err != nil {
			return fmt.Errorf("images: %s: write signature: %w%s", b.final, err, ioHint(err))
		}
	} else if err := os.Remove(filepath.Join(b.tmp, SignatureName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// A signature of a manifest never written (kcr died in between).
		return fmt.Errorf("images: %s: remove stale signature: %w", b.final, err)
	}
	if err := b.writeRootFile(manifestTmp, ManifestName, data); err != nil {
		return fmt.Errorf("images: %s: write manifest: %w%s", b.final, err, ioHint(err))
	}
	return nil
}

// writeRootFile writes data to tmpName in the image root, then renames it
// to name.
func (b *Builder) writeRootFile(tmpName, name string, data []byte) error {
	tmp := filepath.Join(b.tmp, tmpName)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(filePerm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(b.tmp, name))
	}
	return err
}

// Abort removes the temporary directory and everything in it. It is
// idempotent, and a no-op after a successful Commit.
func (b *Builder) Abort() error {
	if b.done {
		return nil
	}
	if err := os.RemoveAll(b.tmp); err != nil {
		return fmt.Errorf("images: %s: remove incomplete image %s: %w; delete it by hand", b.final, b.tmp, err)
	}
	b.done = true
	return nil
}
