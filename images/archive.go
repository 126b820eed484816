package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// An image archive is one file holding a whole image, to copy it to
// another host: a tar stream compressed with zstd (a standard .tar.zst,
// which "tar --zstd -xf" also unpacks). Its first entry is manifest.json,
// byte for byte as in the image; then, for a signed image, its signature
// (SignatureName); then the files the manifest lists, in its order, as
// regular files of mode 0600. Nothing else is archived: files the manifest
// does not list (such as the restore counter kcr keeps in the image) stay
// behind.
//
// [Import] refuses unsafe or unlisted entries and anything but regular
// files and directories, checks every file's size and SHA-256 against the
// manifest while unpacking it into a hidden temporary directory, and
// renames that into place only once the whole image has been verified.
// That proves the archive agrees with itself, not who wrote it: only
// [WithVerifyKeys] does, checking the signature before anything is
// unpacked.

// ErrBadArchive: an image archive cannot be read: it is not zstd or tar,
// it is truncated, or its compressed data is damaged.
var ErrBadArchive = errors.New("unreadable image archive")

const (
	// ArchiveExt is the customary file name extension of image archives.
	ArchiveExt = ".tar.zst"

	// archiveDamaged is the fix suggested for an archive that fails a check.
	archiveDamaged = "the archive is damaged or was tampered with; export the image again"
	// maxArchiveWindow bounds the memory a hostile archive can make the
	// zstd decoder allocate; kcr writes 8 MiB windows.
	maxArchiveWindow = 64 << 20
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

// export is Export without the count; the image it returns is closed.
func export(ctx context.Context, dir string, w io.Writer) (*Image, error) {
	im, err := Open(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer im.Close() // export reads through a root of its own
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	defer root.Close()

	// Archive the manifest's exact bytes, and make sure they are the ones
	// Open verified.
	raw, err := readRootFile(root, ManifestName, MaxManifestSize)
	if errors.Is(err, errTooBig) {
		return nil, manifestTooBig(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("images: %s: read %s: %w%s", dir, ManifestName, err, ioHint(err))
	}
	m, err := decodeManifest(dir, raw)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(m.Files, im.Manifest.Files) {
		return nil, newError(dir, ManifestName, ErrCorruptManifest, nil,
			ManifestName+" changed while exporting: is something rewriting this image? export it again")
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
	if err := tw.WriteHeader(header(ManifestName, int64(len(raw)))); err != nil {
		return nil, writeErr(err)
	}
	if _, err := tw.Write(raw); err != nil {
		return nil, writeErr(err)
	}
	// The signature, if any, travels second, so that an import can check
	// it before it unpacks anything.
	sig, err := readRootFile(root, SignatureName, maxSigFile)
	switch {
	case err == nil:
		if err := tw.WriteHeader(header(SignatureName, int64(len(sig)))); err != nil {
			return nil, writeErr(err)
		}
		if _, err := tw.Write(sig); err != nil {
			return nil, writeErr(err)
		}
	case errors.Is(err, errTooBig):
		return nil, newError(dir, SignatureName, ErrSignature, nil,
			fmt.Sprintf("%s is larger than %d bytes, not a kcr signature: remove it or sign the image again", SignatureName, maxSigFile))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("images: %s: read %s: %w%s", dir, SignatureName, err, ioHint(err))
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
// file, mode 0600. The archive is written to a hidden temporary sibling,
// synced and renamed into place, so file never holds a partial archive;
// an existing file is never replaced. It returns the verified image and
// the archive's size in bytes.
func ExportFile(ctx context.Context, dir, file string) (*Image, int64, error) {
	if file == "" {
		return nil, 0, fmt.Errorf("images: %s: no archive file name given; pass -o FILE", dir)
	}
	parent, base := filepath.Split(file)
	if parent == "" {
		parent = "."
	}
	if base == "" {
		return nil, 0, fmt.Errorf("images: %s: %s names a directory; give a file name such as img%s", dir, file, ArchiveExt)
	}
	if _, err := os.Lstat(file); err == nil {
		return nil, 0, newError(file, "", ErrExists, nil, "already exists; choose another -o or remove it")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("images: %s: %w%s", file, err, ioHint(err))
	}
	tmp, err := os.CreateTemp(parent, "."+base+tmpMarker+"*") // mode 0600
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, 0, fmt.Errorf("images: %s: directory %s does not exist: create it first", file, parent)
		}
		return nil, 0, fmt.Errorf("images: %s: create temporary file: %w%s", file, err, ioHint(err))
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	im, size, err := Export(ctx, dir, tmp)
	if err != nil {
		return nil, 0, err
	}
	if err := tmp.Chmod(filePerm); err == nil {
		err = tmp.Sync()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("images: %s: write archive: %w%s", file, err, ioHint(err))
	}
	if err := tmp.Close(); err != nil {
		return nil, 0, fmt.Errorf("images: %s: write archive: %w%s", file, err, ioHint(err))
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("images: %s: export: %w", file, err)
	}
	if err := renameNoReplace(tmp.Name(), file); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, 0, newError(file, "", ErrExists, err, "already exists (created during the export); choose another -o or remove it")
		}
		return nil, 0, fmt.Errorf("images: %s: rename %s into place: %w", file, tmp.Name(), err)
	}
	done = true
	if err := syncDir(parent); err != nil {
		return nil, 0, fmt.Errorf("images: %s: sync directory: %w", file, err)
	}
	return im, size, nil
}

// renameNoReplace renames oldpath to newpath unless newpath exists.
func renameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	// The file system lacks RENAME_NOREPLACE: link(2) refuses to replace too.
	if err := os.Link(oldpath, newpath); err != nil {
		return err
	}
	return os.Remove(oldpath)
}

// Import reads an image archive written by [Export] from r and unpacks it
// as a new image at final, which must not exist or be an empty directory
// (as for [Create]). The archive's manifest must come first; every later
// entry must be a regular file the manifest lists, or a directory holding
// one; absolute paths, ".." components, links, devices, duplicate and
// unlisted entries are refused. Each file is checked against the
// manifest's size and SHA-256 as it is written, and every listed file must
// be present. The image is built in a hidden temporary sibling, like
// Create's, synced and renamed into place only once all of it has been
// verified: on error nothing is left at final. Errors wrap the sentinel
// errors, [ErrBadArchive] for an unreadable or truncated archive; their
// Dir is final.
//
// Before it unpacks anything, Import adds up the sizes the manifest lists
// and refuses an image larger than the limit ([DefaultMaxImportSize], or
// [WithMaxSize]) or than the free space at final's file system, with
// [ErrTooLarge]; each entry must be exactly its listed size.
func Import(ctx context.Context, r io.Reader, final string, opts ...ImportOption) (*Image, error) {
	return importArchive(ctx, r, final, final, opts)
}

// Names in a CRI-O checkpoint archive written by kcr (engine.ExportArchive).
const (
	// CRIOManifestName is the kcr manifest's name in the archive.
	CRIOManifestName = "kcr-manifest.json"
	// CRIOSignatureName is its signature's (SignatureName), right after it.
	CRIOSignatureName = "kcr-manifest.sig"
	// CRIOCheckpointDir holds CRIU's files: the image's criu/ directory.
	CRIOCheckpointDir = "checkpoint"
)

// crioOwn are the archive's files for CRI-O and checkpointctl, not listed
// in the kcr manifest: an import skips them.
var crioOwn = map[string]bool{"config.dump": true, "spec.dump": true}

// ImportCRIOFile imports a CRI-O checkpoint archive written by "kcr export
// --format cri-o" (a tar, plain or zstd-compressed) into the image final,
// with every check of [Import]: kcr-manifest.json is the manifest,
// checkpoint/ becomes criu/, and CRI-O's config.dump and spec.dump are
// skipped. An archive without kcr's manifest (one written by Podman or
// CRI-O) is refused with [ErrNotImage]: nothing could verify it.
func ImportCRIOFile(ctx context.Context, file, final string, opts ...ImportOption) (*Image, error) {
	return ImportFile(ctx, file, final, append(opts, crioLayout)...)
}

// ImportCRIO imports a CRI-O checkpoint archive read from r, as
// [ImportCRIOFile] does (r may be the layer of an OCI checkpoint image).
func ImportCRIO(ctx context.Context, r io.Reader, final string, opts ...ImportOption) (*Image, error) {
	return Import(ctx, r, final, append(opts, crioLayout)...)
}

var crioLayout ImportOption = importOpt{func(c *importConfig) { c.crio = true }}

// zstdMagic starts every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// crioName maps an entry of a CRI-O archive to its path in the image; ""
// means skip it.
func crioName(name string) string {
	switch {
	case crioOwn[name]:
		return ""
	case name == CRIOManifestName:
		return ManifestName
	case name == CRIOSignatureName:
		return SignatureName
	case name == ManifestName, name == SignatureName:
		return name + ".archived" // only kcr's names fill these: refused as unlisted
	case name == CRIOCheckpointDir:
		return CRIUSubdir
	}
	if rest, ok := strings.CutPrefix(name, CRIOCheckpointDir+"/"); ok {
		return CRIUSubdir + "/" + rest
	}
	if name == CRIUSubdir || strings.HasPrefix(name, CRIUSubdir+"/") {
		return "archived-" + name // only checkpoint/ may fill criu/
	}
	return name
}

// DefaultMaxImportSize bounds the image an archive may unpack to: a few KiB
// of zstd can expand to many GiB of zeros.
const DefaultMaxImportSize int64 = 64 << 30

// ImportOption configures [Import] and [ImportFile]. Options are values of
// an interface, as in franz-go and package notify.
type ImportOption interface {
	apply(*importConfig)
}

type importOpt struct{ fn func(*importConfig) }

func (o importOpt) apply(c *importConfig) { o.fn(c) }

type importConfig struct {
	maxSize int64
	keys    []ed25519.PublicKey
	crio    bool // a CRI-O checkpoint archive: see ImportCRIOFile
}

// WithMaxSize sets the largest image, in bytes, that an import unpacks.
// Default: DefaultMaxImportSize (64 GiB).
func WithMaxSize(n int64) ImportOption {
	return importOpt{func(c *importConfig) { c.maxSize = n }}
}

// WithVerifyKeys makes the import require a signature of the archive's
// manifest by one of keys (see [OpenOptions.VerifyKeys]), checked before
// anything is unpacked. Without it, a signature in the archive is kept
// unchecked, for a later restore --verify-key. Default: no key.
func WithVerifyKeys(keys []ed25519.PublicKey) ImportOption {
	return importOpt{func(c *importConfig) { c.keys = keys }}
}

// ImportFile imports the archive file (see [Import]). Errors name file.
func ImportFile(ctx context.Context, file, final string, opts ...ImportOption) (*Image, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, newError(file, "", ErrNotExist, err, "does not exist: check the archive path")
	}
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", file, err, ioHint(err))
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return nil, newError(file, "", ErrBadArchive, nil,
			`is a directory, not an archive: give a file written by "kcr export" (an image directory needs no import)`)
	}
	return importArchive(ctx, f, final, file, opts)
}

// importer unpacks one archive. label names the archive in errors.
type importer struct {
	ctx   context.Context
	label string
	b     *Builder
	root  *os.Root // b.tmp
	m     *Manifest
	raw   []byte // manifest.json as archived
	sig   []byte // its signature as archived, or nil
	// signer is the key that signed raw, once checked (cfg.keys set).
	signer ed25519.PublicKey

	listed map[string]FileEntry
	dirs   map[string]bool // ancestors of listed files: allowed directory entries
	seen   map[string]bool // entries unpacked so far
	made   map[string]bool // directories created
	buf    []byte
	cfg    importConfig
}

func importArchive(ctx context.Context, r io.Reader, final, label string, opts []ImportOption) (*Image, error) {
	cfg := importConfig{maxSize: DefaultMaxImportSize}
	for _, o := range opts {
		o.apply(&cfg)
	}
	b, err := Create(final)
	if err != nil {
		return nil, err
	}
	defer b.Abort()
	lock, err := lockImport(b.tmp)
	if err != nil {
		return nil, errNoLock(final, err)
	}
	defer lock.Close()
	// Ours is locked and marked, so it is never taken for a killed one.
	for _, d := range removeStaleImports(filepath.Dir(b.tmp)) {
		slog.Info("images: removed the temporary directory of a killed import", "dir", d)
	}
	root, err := os.OpenRoot(b.tmp)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", final, err)
	}
	defer root.Close()

	var zr io.Reader
	if cfg.crio {
		// CRI-O's archives are plain tar, Podman's may be compressed.
		br := bufio.NewReader(ctxReader{ctx, r})
		zr = br
		if magic, _ := br.Peek(4); bytes.Equal(magic, zstdMagic) {
			zd, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxArchiveWindow))
			if err != nil {
				return nil, fmt.Errorf("images: %s: zstd: %w", label, err)
			}
			defer zd.Close()
			zr = zd
		}
	} else {
		zd, err := zstd.NewReader(ctxReader{ctx, r}, zstd.WithDecoderMaxWindow(maxArchiveWindow))
		if err != nil {
			return nil, fmt.Errorf("images: %s: zstd: %w", label, err)
		}
		defer zd.Close()
		zr = zd
	}
	im := &importer{
		ctx: ctx, label: label, b: b, root: root,
		seen: map[string]bool{}, made: map[string]bool{".": true, CRIUSubdir: true},
		buf: make([]byte, 1<<20), cfg: cfg,
	}
	tr := tar.NewReader(zr)
	for i := 0; ; {
		hdr, err := tr.Next()
		if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
			err = nil // checkName says why, with the fix
		}
		if err == io.EOF && i == 0 && cfg.crio {
			return nil, im.errorf("", ErrNotImage, nil, "holds no %s: not a checkpoint archive of \"kcr export --format cri-o\" (restore Podman's or CRI-O's own archives with podman or CRI-O)", CRIOManifestName)
		}
		if err == io.EOF && i == 0 {
			return nil, im.badArchive(nil, "is empty: not a kcr image archive (was it written by \"kcr export\"?)")
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, im.readError(err, "")
		}
		name, err := im.checkName(hdr)
		if err != nil {
			return nil, err
		}
		if cfg.crio {
			if name = crioName(name); name == "" {
				continue
			}
			if i == 0 && name != ManifestName {
				return nil, im.errorf(name, ErrNotImage, nil, "archive entry %q comes before %s: not a checkpoint archive of \"kcr export --format cri-o\" (restore Podman's or CRI-O's own archives with podman or CRI-O)", hdr.Name, CRIOManifestName)
			}
		}
		i++
		if i == 1 {
			if err := im.readManifest(hdr, name, tr); err != nil {
				return nil, err
			}
			continue
		}
		if i == 2 && name == SignatureName && hdr.Typeflag == tar.TypeReg {
			if err := im.readSignature(hdr, tr); err != nil {
				return nil, err
			}
			continue
		}
		if err := im.checkSigned(); err != nil {
			return nil, err
		}
		if err := im.unpack(hdr, name, tr); err != nil {
			return nil, err
		}
	}
	// Read the zstd stream to its end so that its checksum is verified.
	if _, err := io.CopyBuffer(io.Discard, zr, im.buf); err != nil {
		return nil, im.readError(err, "")
	}
	if err := im.checkSigned(); err != nil {
		return nil, err
	}
	for _, f := range im.m.Files {
		if !im.seen[f.Path] {
			return nil, im.errorf(f.Path, ErrMissing, nil,
				"%s is missing from the archive (listed in %s); %s", f.Path, ManifestName, archiveDamaged)
		}
	}
	return im.commit()
}

// checkName refuses entries whose path is unsafe or whose type is neither
// a regular file nor a directory, whatever the manifest says. It returns
// the slash-separated path, without a directory's trailing slash.
func (im *importer) checkName(hdr *tar.Header) (string, error) {
	name := hdr.Name
	if hdr.Typeflag == tar.TypeDir {
		name = strings.TrimSuffix(name, "/")
	}
	switch {
	case strings.HasPrefix(name, "/"):
		return "", im.errorf(name, ErrUnsafePath, nil,
			"archive entry %q is an absolute path: refusing to write outside the image; %s", hdr.Name, archiveDamaged)
	case slices.Contains(strings.Split(name, "/"), ".."):
		return "", im.errorf(name, ErrUnsafePath, nil,
			"archive entry %q has a \"..\" component: refusing to write outside the image; %s", hdr.Name, archiveDamaged)
	case !fs.ValidPath(name) || name == "." || strings.ContainsRune(name, 0):
		return "", im.errorf(name, ErrUnsafePath, nil,
			"archive entry %q is not a clean relative path: refusing it; %s", hdr.Name, archiveDamaged)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
		return name, nil
	}
	kind := tarKind(hdr)
	return "", im.errorf(name, ErrUnsafePath, nil,
		"archive entry %s is a %s: image archives hold only regular files and directories; %s", name, kind, archiveDamaged)
}

// tarKind names a tar entry type for messages.
func tarKind(hdr *tar.Header) string {
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		return fmt.Sprintf("symlink to %q", hdr.Linkname)
	case tar.TypeLink:
		return fmt.Sprintf("hard link to %q", hdr.Linkname)
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "named pipe"
	}
	return fmt.Sprintf("special entry (tar type %q)", hdr.Typeflag)
}

// readManifest reads and validates the first entry, which must be the
// manifest.
func (im *importer) readManifest(hdr *tar.Header, name string, tr *tar.Reader) error {
	if name != ManifestName || hdr.Typeflag != tar.TypeReg {
		return im.errorf(name, ErrNotImage, nil,
			"first archive entry is %q, not %s: not a kcr image archive (was it written by \"kcr export\"?)", hdr.Name, ManifestName)
	}
	if hdr.Size > MaxManifestSize {
		return im.errorf(ManifestName, ErrCorruptManifest, nil,
			"%s is corrupt: %d bytes, larger than %d; %s", ManifestName, hdr.Size, MaxManifestSize, archiveDamaged)
	}
	raw := make([]byte, hdr.Size)
	if _, err := io.ReadFull(tr, raw); err != nil {
		return im.readError(err, ManifestName)
	}
	m, err := decodeManifest(im.label, raw)
	if err != nil {
		return im.rehome(err)
	}
	im.m, im.raw = m, raw
	im.listed = make(map[string]FileEntry, len(m.Files))
	im.dirs = map[string]bool{CRIUSubdir: true}
	for _, f := range m.Files {
		im.listed[f.Path] = f
		for d := path.Dir(f.Path); d != "."; d = path.Dir(d) {
			im.dirs[d] = true
		}
	}
	for _, f := range m.Files {
		if im.dirs[f.Path] {
			return im.errorf(f.Path, ErrCorruptManifest, nil,
				"%s is corrupt: it lists %s both as a file and as a directory; %s", ManifestName, f.Path, archiveDamaged)
		}
	}
	im.seen[ManifestName] = true
	return im.checkSpace()
}

// readSignature reads the manifest's signature, the second entry.
func (im *importer) readSignature(hdr *tar.Header, tr *tar.Reader) error {
	if hdr.Size > maxSigFile {
		return im.errorf(SignatureName, ErrSignature, nil,
			"%s is %d bytes, larger than %d: not a kcr signature; %s", SignatureName, hdr.Size, maxSigFile, archiveDamaged)
	}
	sig := make([]byte, hdr.Size)
	if _, err := io.ReadFull(tr, sig); err != nil {
		return im.readError(err, SignatureName)
	}
	im.sig = sig
	im.seen[SignatureName] = true
	return im.checkSigned()
}

// checkSigned verifies the signature once, before the first file is
// unpacked, when keys are required.
func (im *importer) checkSigned() error {
	if len(im.cfg.keys) == 0 || im.signer != nil {
		return nil
	}
	pub, err := verifySignature(im.label, im.raw, im.sig, im.cfg.keys)
	if err != nil {
		return err
	}
	im.signer = pub
	return nil
}

// checkSpace refuses, before anything is unpacked, an image larger than the
// limit or than the space left for it.
func (im *importer) checkSpace() error {
	var total int64
	for _, f := range im.m.Files {
		if f.Size < 0 || total+f.Size < total {
			return im.errorf(f.Path, ErrCorruptManifest, nil, "%s is corrupt: %s has an impossible size %d; %s", ManifestName, f.Path, f.Size, archiveDamaged)
		}
		total += f.Size
	}
	if total > im.cfg.maxSize {
		return im.errorf("", ErrTooLarge, nil, "the image would take %d bytes, above the import limit of %d: pass --max-size with a larger limit if you trust this archive", total, im.cfg.maxSize)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(im.b.tmp, &st); err == nil {
		if free := int64(st.Bavail) * st.Bsize; free >= 0 && total > free {
			return im.errorf("", ErrTooLarge, nil, "the image would take %d bytes, but only %d are free at %s: free some space or import elsewhere", total, free, filepath.Dir(im.b.final))
		}
	}
	return nil
}

// unpack writes one entry after the manifest into the temporary image.
func (im *importer) unpack(hdr *tar.Header, name string, tr *tar.Reader) error {
	if im.seen[name] {
		return im.errorf(name, ErrUnsafePath, nil,
			"archive entry %s appears twice: refusing it, a second copy could replace a verified file; %s", name, archiveDamaged)
	}
	im.seen[name] = true
	if hdr.Typeflag == tar.TypeDir {
		if !im.dirs[name] {
			return im.errorf(name, ErrUnsafePath, nil,
				"archive entry %s/ is a directory that holds no file listed in %s: refusing it; %s", name, ManifestName, archiveDamaged)
		}
		return im.mkdirs(name)
	}
	f, ok := im.listed[name]
	if !ok {
		return im.errorf(name, ErrUnsafePath, nil,
			"archive entry %s is not listed in %s: refusing to unpack it; %s", name, ManifestName, archiveDamaged)
	}
	if hdr.Size != f.Size {
		return im.rehome(sizeError(im.label, f, hdr.Size))
	}
	if err := im.mkdirs(path.Dir(name)); err != nil {
		return err
	}
	out, err := im.root.OpenFile(filepath.FromSlash(name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, filePerm)
	if err != nil {
		return im.writeError(name, err)
	}
	defer out.Close()
	h := sha256.New()
	src := &trackReader{r: tr}
	n, err := io.CopyBuffer(io.MultiWriter(out, h), src, im.buf)
	switch {
	case src.err != nil:
		return im.readError(src.err, name)
	case err != nil:
		return im.writeError(name, err)
	case n != f.Size:
		return im.rehome(sizeError(im.label, f, n))
	case hex.EncodeToString(h.Sum(nil)) != strings.ToLower(f.SHA256):
		return im.errorf(name, ErrCorrupt, nil,
			"%s is corrupt: sha256 mismatch with %s; %s", name, ManifestName, archiveDamaged)
	}
	// Chmod explicitly: the umask may have narrowed 0600.
	if err := out.Chmod(filePerm); err != nil {
		return im.writeError(name, err)
	}
	if err := out.Close(); err != nil {
		return im.writeError(name, err)
	}
	return nil
}

// mkdirs creates dir and its parents in the temporary image, mode 0700.
func (im *importer) mkdirs(dir string) error {
	if im.made[dir] {
		return nil
	}
	if err := im.mkdirs(path.Dir(dir)); err != nil {
		return err
	}
	p := filepath.FromSlash(dir)
	err := im.root.Mkdir(p, dirPerm)
	if err == nil {
		err = im.root.Chmod(p, dirPerm)
	}
	if err != nil {
		// A listed file is in the way: the manifest lists both a file
		// and files under it.
		return im.writeError(dir, err)
	}
	im.made[dir] = true
	return nil
}

// commit writes the manifest, syncs and renames the image into place, as
// [Builder.Commit] does, but keeps the manifest's archived bytes.
func (im *importer) commit() (*Image, error) {
	b := im.b
	if err := im.root.Remove(importMark); err != nil {
		return nil, im.writeError(importMark, err)
	}
	if err := b.writeManifestBytes(im.raw, im.sig); err != nil {
		return nil, err
	}
	if err := b.publish(im.ctx, "import"); err != nil {
		return nil, err
	}
	return &Image{Dir: b.final, Manifest: im.m, Signer: im.signer}, nil
}

func (im *importer) errorf(p string, kind, cause error, format string, args ...any) error {
	return newError(im.label, p, kind, cause, fmt.Sprintf(format, args...))
}

// rehome turns an image error about the archived data into one about the
// archive, with the archive's fix.
func (im *importer) rehome(err error) error {
	e, ok := errors.AsType[*Error](err)
	if !ok {
		return err
	}
	c := *e
	c.Dir = im.label
	c.msg = strings.ReplaceAll(c.msg, "the manifest was tampered with or "+damaged, archiveDamaged)
	c.msg = strings.ReplaceAll(c.msg, damaged, archiveDamaged)
	return &c
}

func (im *importer) badArchive(cause error, msg string) error {
	return newError(im.label, "", ErrBadArchive, cause, msg)
}

// readError explains an error reading the archive, while reading entry p
// if not empty.
func (im *importer) readError(err error, p string) error {
	if cerr := im.ctx.Err(); cerr != nil {
		return fmt.Errorf("images: %s: import: %w", im.label, cerr)
	}
	where := ""
	if p != "" {
		where = " in " + p
	}
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		if p != "" {
			where = " (it ends in " + p + ")"
		}
		return im.badArchive(err, fmt.Sprintf("archive is truncated%s: copy it again in full, or export the image again", where))
	case errors.Is(err, zstd.ErrMagicMismatch):
		return im.badArchive(err, `is not a zstd-compressed archive: give a file written by "kcr export"`)
	case errors.Is(err, tar.ErrHeader):
		return im.badArchive(err, fmt.Sprintf("archive is not a valid tar stream%s (%v): give a file written by \"kcr export\", or export the image again", where, err))
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("images: %s: read archive: %w%s", im.label, err, ioHint(err))
	}
	return im.badArchive(err, fmt.Sprintf("archive is unreadable%s (%v): it is truncated or damaged; copy it again, or export the image again", where, err))
}

func (im *importer) writeError(p string, err error) error {
	return fmt.Errorf("images: %s: write %s: %w%s", im.b.final, p, err, ioHint(err))
}

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

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
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
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
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
