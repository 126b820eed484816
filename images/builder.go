package images

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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

	// Every write, the seal and the publication go through these fds, not
	// through the paths above: a path can be swapped, an fd cannot.
	parent             *os.File // final's parent directory
	dir                *os.File // the temporary directory
	root               *os.Root // the temporary directory
	tmpBase, finalBase string

	signer ed25519.PrivateKey // signs the manifest if set

	// pre holds the hashes Prehash took, by path; seal uses one only if
	// the file is still the one hashed.
	pre map[string]prehashed
}

// prehashed is a file hashed ahead of Commit and what identified it then.
type prehashed struct {
	e       FileEntry
	ino     uint64
	mtimeNS int64
}

// SignWith makes Commit (and Recover) sign the manifest with priv, writing
// SignatureName beside it, so that the image is published signed.
func (b *Builder) SignWith(priv ed25519.PrivateKey) { b.signer = priv }

// Create validates final as the destination of a new image and creates the
// temporary directory to build it in. The parent of final must exist;
// final itself must not exist or must be an empty directory, which Commit
// then replaces. As root, the parent and every directory above it must
// belong to root (or the caller) and be closed to writes by others (see
// [OpenTrustedDir]), else ErrUntrusted: another user could swap the image
// kcr writes, and signs, for one of theirs.
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
	pd, err := openParent(final, parent)
	if err != nil {
		return nil, err
	}
	b := &Builder{final: abs, parent: pd, finalBase: base}
	if err := b.checkFree(); err != nil {
		b.release()
		return nil, err
	}
	for range 100 {
		b.tmpBase = "." + base + tmpMarker + strconv.FormatUint(rand.Uint64()%1e10, 10)
		err = unix.Mkdirat(int(pd.Fd()), b.tmpBase, dirPerm)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		b.release()
		return nil, fmt.Errorf("images: %s: create temporary directory: %w%s", final, err, ioHint(err))
	}
	b.tmp = filepath.Join(parent, b.tmpBase)
	if err := b.openTmp(); err != nil {
		unix.Unlinkat(int(pd.Fd()), b.tmpBase, unix.AT_REMOVEDIR)
		b.release()
		return nil, fmt.Errorf("images: %s: prepare temporary directory: %w", final, err)
	}
	// Chmod explicitly: the umask may have narrowed Mkdir's 0700.
	err = b.dir.Chmod(dirPerm)
	if err == nil {
		err = b.root.Mkdir(CRIUSubdir, dirPerm)
	}
	if err == nil {
		err = b.root.Chmod(CRIUSubdir, dirPerm)
	}
	if err != nil {
		b.Abort()
		return nil, fmt.Errorf("images: %s: prepare temporary directory: %w", final, err)
	}
	return b, nil
}

// openParent opens the parent directory of a new image (or archive): as
// root through OpenTrustedDir.
func openParent(final, parent string) (*os.File, error) {
	pd, _, err := openDir(parent, os.Geteuid() == 0, outputFix)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: %s: parent directory %s: %w: create it first", final, parent, syscall.ENOENT)
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return nil, fmt.Errorf("images: %s: parent %s is not a directory; choose another -o", final, parent)
	}
	if e, ok := errors.AsType[*Error](err); ok {
		e.Dir = final
		return nil, e
	}
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", final, err, ioHint(err))
	}
	return pd, nil
}

// openTmp opens the temporary directory tmpBase in the parent, not through
// a link, and checks that it is the caller's.
func (b *Builder) openTmp() error {
	fd, err := unix.Openat(int(b.parent.Fd()), b.tmpBase, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), b.tmp)
	fi, err := d.Stat()
	if err != nil {
		d.Close()
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		d.Close()
		return fmt.Errorf("%s is not a directory of uid %d", b.tmp, os.Geteuid())
	}
	root, err := rootOf(d)
	if err != nil {
		d.Close()
		return err
	}
	b.dir, b.root = d, root
	return nil
}

// release closes the Builder's fds.
func (b *Builder) release() {
	if b.root != nil {
		b.root.Close()
		b.root = nil
	}
	if b.dir != nil {
		b.dir.Close()
		b.dir = nil
	}
	if b.parent != nil {
		b.parent.Close()
		b.parent = nil
	}
}

// checkFree reports whether the final name in the parent may become a new
// image: it must not exist or be an empty directory.
func (b *Builder) checkFree() error {
	var st unix.Stat_t
	err := unix.Fstatat(int(b.parent.Fd()), b.finalBase, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w%s", b.final, err, ioHint(err))
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		fd, err := unix.Openat(int(b.parent.Fd()), b.finalBase, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("images: %s: %w%s", b.final, err, ioHint(err))
		}
		d := os.NewFile(uintptr(fd), b.final)
		names, _ := d.Readdirnames(1)
		d.Close()
		if len(names) == 0 {
			return nil
		}
	}
	return newError(b.final, "", ErrExists, nil, "already exists; choose another -o or remove it")
}

// Dir returns the temporary root of the image being built. Runtimes that
// take a path (CRIU, runc, podman) write there; kcr's own writes go through
// [Builder.WriteFile].
func (b *Builder) Dir() string { return b.tmp }

// CRIUDir returns the directory CRIU should dump into.
func (b *Builder) CRIUDir() string { return filepath.Join(b.tmp, CRIUSubdir) }

// Final returns the absolute path the image will have once committed.
func (b *Builder) Final() string { return b.final }

// WriteFile writes data as the new file name (slash-separated, relative to
// the image root) through the temporary directory's fd: never through a
// link, never over a file that is already there.
func (b *Builder) WriteFile(name string, data []byte) error {
	if err := b.writeNew(name, data); err != nil {
		return fmt.Errorf("images: %s: write %s: %w%s", b.final, name, err, ioHint(err))
	}
	return nil
}

// writeNew creates name in the temporary root with O_EXCL|O_NOFOLLOW and
// writes data to it, mode 0600.
func (b *Builder) writeNew(name string, data []byte) error {
	if b.root == nil {
		return fmt.Errorf("builder already committed or aborted")
	}
	f, err := b.root.OpenFile(filepath.FromSlash(name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(filePerm) // the umask may have narrowed it
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Detach replaces name (slash-separated, relative to the image root) with a
// copy of itself, so that a process still holding the old file open cannot
// change the image once Commit has hashed it: kcr's CRIU action script
// inherits CRIU's log as stderr, and its watcher may log there after the
// runtime has returned. Late writes go to the old, unlinked file. A missing
// name is not an error.
func (b *Builder) Detach(name string) error {
	if b.root == nil {
		return fmt.Errorf("images: %s: builder already committed or aborted", b.final)
	}
	if err := b.detach(filepath.FromSlash(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("images: %s: detach %s: %w%s", b.final, name, err, ioHint(err))
	}
	return nil
}

// KeepBeside moves the file at path, inside the unfinished image, into
// the image's parent directory as name (replacing what is there), and
// returns its new path: for CRIU's log of a failed dump, which Abort would
// remove with the image. Both directories are the ones the Builder opened
// and checked, so no path is looked up again.
func (b *Builder) KeepBeside(path, name string) (string, error) {
	if b.root == nil {
		return "", fmt.Errorf("images: %s: builder already committed or aborted", b.final)
	}
	rel, err := filepath.Rel(b.tmp, path)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("images: %s: %s is not inside the image", b.final, path)
	}
	if filepath.Base(name) != name || name == "." || name == ".." {
		return "", fmt.Errorf("images: %s: %q is not a plain file name", b.final, name)
	}
	if err := unix.Renameat(int(b.dir.Fd()), rel, int(b.parent.Fd()), name); err != nil {
		return "", fmt.Errorf("images: %s: keep %s: %w%s", b.final, rel, err, ioHint(err))
	}
	return filepath.Join(filepath.Dir(b.tmp), name), nil
}

func (b *Builder) detach(name string) error {
	src, err := b.root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("a %s, not a regular file", kindOf(fi.Mode()))
	}
	tmp := name + ".detach"
	dst, err := b.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = b.root.Rename(tmp, name)
	}
	if err != nil {
		b.root.Remove(tmp)
	}
	return err
}

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
	go func() { synced <- unix.Syncfs(int(b.dir.Fd())) }()
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
	if err := b.root.Remove(PendingName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: %s: remove draft manifest: %w", b.final, err)
	}
	root := b.root
	b.root = nil // publish releases the fds; the cache goes through this one
	if err := b.publish(ctx, "checkpoint"); err != nil {
		b.root = root
		return nil, err
	}
	defer root.Close()
	// The files were just hashed in a private directory: the first restore
	// need not read them again.
	ids := make(map[string]fileID, len(files))
	for _, f := range files {
		if id, ok := statIDRoot(root, f.Path, f.SHA256); ok {
			ids[f.Path] = id
		}
	}
	if len(ids) == len(files) {
		writeVerified(root, ids)
	}
	return &Image{Dir: b.final, Manifest: m}, nil
}

// publish makes the temporary directory durable and renames it into place
// within the parent's fd, once sure that the name still holds the
// directory kcr wrote; op names what built it, for errors.
func (b *Builder) publish(ctx context.Context, op string) error {
	// One syncfs makes every file, the manifest and the directories durable
	// before the rename publishes them; per-file fsyncs cost a flush each.
	if err := unix.Syncfs(int(b.dir.Fd())); err != nil {
		return fmt.Errorf("images: %s: sync: %w", b.final, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("images: %s: %s: %w", b.final, op, err)
	}
	var named, held unix.Stat_t
	if err := unix.Fstatat(int(b.parent.Fd()), b.tmpBase, &named, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("images: %s: %s: temporary directory %s: %w", b.final, op, b.tmp, err)
	}
	if err := unix.Fstat(int(b.dir.Fd()), &held); err != nil {
		return fmt.Errorf("images: %s: %s: %w", b.final, op, err)
	}
	if named.Dev != held.Dev || named.Ino != held.Ino {
		return newError(b.final, "", ErrUntrusted, nil, fmt.Sprintf(
			"the temporary directory %s was replaced during the %s: refusing to publish (or sign) it; %s", b.tmp, op, outputFix))
	}
	// rename(2), unlike os.Rename, atomically replaces an empty directory
	// and refuses a non-empty one, so a destination that filled up since
	// Create is never clobbered.
	if err := unix.Renameat(int(b.parent.Fd()), b.tmpBase, int(b.parent.Fd()), b.finalBase); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTDIR) {
			return newError(b.final, "", ErrExists, err, "already exists (created during the "+op+"); choose another -o or remove it")
		}
		return fmt.Errorf("images: %s: rename %s into place: %w", b.final, b.tmp, err)
	}
	b.done = true
	err := b.parent.Sync()
	b.release()
	if err != nil {
		return fmt.Errorf("images: %s: sync parent directory: %w", b.final, err)
	}
	return nil
}

// seal walks the temporary directory through its fd, fixes permissions
// and hashes every file. It returns the file entries sorted by path and
// the directories.
func (b *Builder) seal(ctx context.Context) ([]FileEntry, []string, error) {
	hs := newHasher()
	files := []FileEntry{} // "files": [] rather than null when empty
	var dirs []string
	err := fs.WalkDir(b.root.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case d.IsDir():
			dirs = append(dirs, rel)
			return b.root.Chmod(filepath.FromSlash(rel), dirPerm)
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
		e, err := sealFile(ctx, hs, b.root, rel, b.prehashedEntry)
		if err != nil {
			if _, ok := errors.AsType[*Error](err); ok {
				return err
			}
			return fmt.Errorf("%s: %w", rel, err)
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

// Prehash hashes the files rels (paths in the image) ahead of Commit, while
// the caller still holds back the step that makes the image the only copy
// (CRIU's post-dump stage, the dumped process frozen), and syncs the file
// system, so that Commit then hashes and syncs only what was written
// since. Commit uses a hash only for the same, unchanged file (inode, size,
// modification time). Cancelling ctx ends it at once, even
// during the sync, which goes on in the background.
func (b *Builder) Prehash(ctx context.Context, rels []string) error {
	if b.done || b.root == nil {
		return fmt.Errorf("images: %s: prehash after commit or abort", b.final)
	}
	if b.pre == nil {
		b.pre = map[string]prehashed{}
	}
	hs := newHasher()
	for _, rel := range rels {
		f, err := b.root.OpenFile(filepath.FromSlash(rel), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("images: %s: prehash: %w", b.final, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(int(f.Fd()), &st)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			err = fmt.Errorf("%s is not a regular file", rel)
		}
		var n int64
		var sum string
		if err == nil {
			n, sum, err = hs.sum(ctx, f)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("images: %s: prehash %s: %w", b.final, rel, err)
		}
		b.pre[rel] = prehashed{e: FileEntry{Size: n, SHA256: sum}, ino: st.Ino, mtimeNS: st.Mtim.Nano()}
	}
	synced := make(chan error, 1)
	go func() { synced <- unix.Syncfs(int(b.dir.Fd())) }()
	select {
	case err := <-synced:
		if err != nil {
			return fmt.Errorf("images: %s: sync: %w", b.final, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("images: %s: prehash: %w", b.final, ctx.Err())
	}
}

// prehashedEntry is rel's hash from Prehash if f (open on rel) is still
// the file hashed then, unchanged.
func (b *Builder) prehashedEntry(rel string, f *os.File) (FileEntry, bool) {
	p, ok := b.pre[rel]
	if !ok {
		return FileEntry{}, false
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Ino != p.ino || st.Size != p.e.Size || st.Mtim.Nano() != p.mtimeNS {
		return FileEntry{}, false
	}
	return p.e, true
}

// sealFile makes rel private and hashes it, through root, refusing
// anything but a regular file. Commit syncs the file system.
func sealFile(ctx context.Context, hs *hasher, root *os.Root, rel string, pre func(string, *os.File) (FileEntry, bool)) (FileEntry, error) {
	f, err := root.OpenFile(filepath.FromSlash(rel), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return FileEntry{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return FileEntry{}, err
	}
	if !fi.Mode().IsRegular() {
		return FileEntry{}, fmt.Errorf("a %s, not a regular file", kindOf(fi.Mode()))
	}
	if err := f.Chmod(filePerm); err != nil {
		return FileEntry{}, err
	}
	if e, ok := pre(rel, f); ok {
		return e, nil
	}
	n, sum, err := hs.sum(ctx, f)
	if err != nil {
		return FileEntry{}, fmt.Errorf("hash: %w", err)
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
	} else if err := b.root.Remove(SignatureName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// A signature of a manifest never written (kcr died in between).
		return fmt.Errorf("images: %s: remove stale signature: %w", b.final, err)
	}
	if err := b.writeRootFile(manifestTmp, ManifestName, data); err != nil {
		return fmt.Errorf("images: %s: write manifest: %w%s", b.final, err, ioHint(err))
	}
	return nil
}

// writeRootFile writes data to tmpName in the image root, a new file, then
// renames it to name; all through the directory's fd.
func (b *Builder) writeRootFile(tmpName, name string, data []byte) error {
	if err := b.root.Remove(tmpName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err // a leftover (or a planted link) is removed, not followed
	}
	if err := b.writeNew(tmpName, data); err != nil {
		return err
	}
	return b.root.Rename(tmpName, name)
}

// Abort removes the temporary directory and everything in it, through the
// directory's fds. It is idempotent, and a no-op after a successful Commit.
func (b *Builder) Abort() error {
	if b.done {
		return nil
	}
	defer b.release()
	if b.root != nil {
		names, _ := b.dir.Readdirnames(-1)
		b.dir.Seek(0, io.SeekStart)
		for _, n := range names {
			if err := b.root.RemoveAll(n); err != nil {
				return fmt.Errorf("images: %s: remove incomplete image %s: %w; delete it by hand", b.final, b.tmp, err)
			}
		}
	}
	if b.parent != nil && b.tmpBase != "" {
		if err := unix.Unlinkat(int(b.parent.Fd()), b.tmpBase, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("images: %s: remove incomplete image %s: %w; delete it by hand", b.final, b.tmp, err)
		}
	}
	b.done = true
	return nil
}
