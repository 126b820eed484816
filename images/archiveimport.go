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

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

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

// zstdMagic starts every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

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
	f, err := OpenArchive(file, false)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return importArchive(ctx, f, final, file, opts)
}

// ImportCRIOFrom imports the CRI-O checkpoint archive open as f (see
// [ImportCRIOFile] and [OpenArchive]). Errors name f.Name().
func ImportCRIOFrom(ctx context.Context, f *os.File, final string, opts ...ImportOption) (*Image, error) {
	return importArchive(ctx, f, final, f.Name(), append(opts, crioLayout))
}

// OpenArchive opens an archive file to import, once, without waiting on a
// FIFO, and checks the fd: a regular file; with trusted, one that passes
// the owner rule (the caller's or root's, closed to writes by others) in a
// directory that passes OpenTrustedDir, and not a link.
func OpenArchive(file string, trusted bool) (*os.File, error) {
	flags := os.O_RDONLY | syscall.O_NONBLOCK
	if trusted {
		flags |= syscall.O_NOFOLLOW
		if err := checkAncestors(file); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(file, flags, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, newError(file, "", ErrNotExist, err, "does not exist: check the archive path")
	}
	if errors.Is(err, syscall.ELOOP) {
		return nil, newError(file, "", ErrUntrusted, err, "is a symlink: give the archive's real path")
	}
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", file, err, ioHint(err))
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("images: %s: %w", file, err)
	case fi.IsDir():
		f.Close()
		return nil, newError(file, "", ErrBadArchive, nil,
			`is a directory, not an archive: give a file written by "kcr export" (an image directory needs no import)`)
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, newError(file, "", ErrBadArchive, nil, fmt.Sprintf("is a %s, not an archive: give a file written by \"kcr export\"", kindOf(fi.Mode())))
	}
	if trusted {
		if why := trustInfo(fi); why != "" {
			f.Close()
			return nil, newError(file, "", ErrUntrusted, nil, fmt.Sprintf("the archive %s; %s", why, untrustedFix))
		}
	}
	if err := setBlocking(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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

	stream *limitedStream // the decompressed archive

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
	root := b.root // released by publish or Abort

	zr, closeZ, err := decompressed(ctx, r, cfg.crio)
	if err != nil {
		return nil, fmt.Errorf("images: %s: zstd: %w", label, err)
	}
	defer closeZ()
	// Until the manifest says how much is to come, the stream may hold
	// only the entries that precede it.
	lim := &limitedStream{r: zr, limit: 2*maxSkippedEntry + MaxManifestSize + maxSigFile + tarSlack}
	im := &importer{
		ctx: ctx, label: label, b: b, root: root, stream: lim,
		seen: map[string]bool{}, made: map[string]bool{".": true, CRIUSubdir: true},
		buf: make([]byte, 1<<20), cfg: cfg,
	}
	if err := im.readEntries(tar.NewReader(lim)); err != nil {
		return nil, err
	}
	// Read the stream to its end, so that the zstd checksum is verified:
	// past the tar's end it may hold only its zero padding.
	if err := im.checkEnd(lim); err != nil {
		return nil, err
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

// decompressed is the archive's tar stream: zstd-decompressed, except for
// a CRI-O archive, which is plain tar unless it starts with zstd's magic
// (Podman's may be compressed). The func releases the decoder.
func decompressed(ctx context.Context, r io.Reader, crio bool) (io.Reader, func(), error) {
	var in io.Reader = ctxReader{ctx, r}
	if crio {
		br := bufio.NewReader(in)
		if magic, _ := br.Peek(4); !bytes.Equal(magic, zstdMagic) {
			return br, func() {}, nil
		}
		in = br
	}
	zd, err := zstd.NewReader(in, zstd.WithDecoderMaxWindow(maxArchiveWindow))
	if err != nil {
		return nil, nil, err
	}
	return zd, zd.Close, nil
}

// readEntries reads the archive's entries in their required order: the
// manifest first (it bounds what may follow), its signature if any, then
// the files it lists, each unpacked and checked as it comes.
func (im *importer) readEntries(tr *tar.Reader) error {
	for i := 0; ; {
		hdr, err := tr.Next()
		if errors.Is(err, tar.ErrInsecurePath) && hdr != nil {
			err = nil // checkName says why, with the fix
		}
		if err == io.EOF && i == 0 && im.cfg.crio {
			return im.errorf("", ErrNotImage, nil, "holds no %s: not a checkpoint archive of \"kcr export --format cri-o\" (restore Podman's or CRI-O's own archives with podman or CRI-O)", CRIOManifestName)
		}
		if err == io.EOF && i == 0 {
			return im.badArchive(nil, "is empty: not a kcr image archive (was it written by \"kcr export\"?)")
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return im.readError(err, "")
		}
		name, err := im.checkName(hdr)
		if err != nil {
			return err
		}
		if im.cfg.crio {
			if name = crioName(name); name == "" {
				if err := im.skip(hdr); err != nil {
					return err
				}
				continue
			}
			if i == 0 && name != ManifestName {
				return im.errorf(name, ErrNotImage, nil, "archive entry %q comes before %s: not a checkpoint archive of \"kcr export --format cri-o\" (restore Podman's or CRI-O's own archives with podman or CRI-O)", hdr.Name, CRIOManifestName)
			}
		}
		i++
		if i == 1 {
			if err := im.readManifest(hdr, name, tr); err != nil {
				return err
			}
			continue
		}
		if i == 2 && name == SignatureName && hdr.Typeflag == tar.TypeReg {
			if err := im.readSignature(hdr, tr); err != nil {
				return err
			}
			continue
		}
		if err := im.checkSigned(); err != nil {
			return err
		}
		if err := im.unpack(hdr, name, tr); err != nil {
			return err
		}
	}
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
	total, err := im.checkSpace()
	if err != nil {
		return err
	}
	// What may follow: the files, a header and padding per entry, the
	// signature and the tar's end; nothing else is decompressed.
	entries := int64(len(im.m.Files) + len(im.dirs) + 2)
	im.stream.limit = im.stream.n + total + entries*tarEntryOverhead + maxSigFile + tarSlack
	return nil
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
func (im *importer) checkSpace() (int64, error) {
	var total int64
	for _, f := range im.m.Files {
		if f.Size < 0 || total+f.Size < total {
			return 0, im.errorf(f.Path, ErrCorruptManifest, nil, "%s is corrupt: %s has an impossible size %d; %s", ManifestName, f.Path, f.Size, archiveDamaged)
		}
		total += f.Size
	}
	if total > im.cfg.maxSize {
		return 0, im.errorf("", ErrTooLarge, nil, "the image would take %d bytes, above the import limit of %d: pass --max-size with a larger limit if you trust this archive", total, im.cfg.maxSize)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(im.b.dir.Fd()), &st); err == nil {
		if free := int64(st.Bavail) * st.Bsize; free >= 0 && total > free {
			return 0, im.errorf("", ErrTooLarge, nil, "the image would take %d bytes, but only %d are free at %s: free some space or import elsewhere", total, free, filepath.Dir(im.b.final))
		}
	}
	return total, nil
}

// Bounds of the decompressed archive beyond the manifest's files.
const (
	// maxSkippedEntry bounds an entry a CRI-O archive holds for CRI-O
	// (config.dump, spec.dump), which the import skips unread.
	maxSkippedEntry = MaxManifestSize
	// tarEntryOverhead is what a tar entry may take besides its data: its
	// header, a PAX header for a long name, and padding.
	tarEntryOverhead = 4 << 10
	// tarSlack is the tar's end (two zero blocks) and the zero padding of
	// its last record (GNU tar's is 10 KiB), with room to spare.
	tarSlack = 64 << 10
)

// errStreamLimit: the decompressed archive is longer than its manifest
// allows.
var errStreamLimit = errors.New("decompressed archive longer than its manifest allows")

// limitedStream fails a read past limit bytes with errStreamLimit: a
// small compressed archive must not make the import decompress without
// end, whatever the tar says.
type limitedStream struct {
	r     io.Reader
	n     int64 // bytes read
	limit int64
}

func (l *limitedStream) Read(p []byte) (int, error) {
	if l.n >= l.limit {
		return 0, errStreamLimit
	}
	if int64(len(p)) > l.limit-l.n {
		p = p[:l.limit-l.n]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	return n, err
}

// skip checks an entry a CRI-O archive holds for CRI-O only, which the tar
// reader then skips: at most maxSkippedEntry bytes, each name once.
func (im *importer) skip(hdr *tar.Header) error {
	if hdr.Size > maxSkippedEntry {
		return im.errorf(hdr.Name, ErrBadArchive, nil, "archive entry %s is %d bytes, larger than the %d kcr allows for it: %s", hdr.Name, hdr.Size, int64(maxSkippedEntry), archiveDamaged)
	}
	if im.seen["skipped:"+hdr.Name] {
		return im.errorf(hdr.Name, ErrBadArchive, nil, "archive entry %s appears twice: %s", hdr.Name, archiveDamaged)
	}
	im.seen["skipped:"+hdr.Name] = true
	return nil
}

// checkEnd reads what follows the tar's end to the end of the stream: at
// most its zero padding, else the archive is refused.
func (im *importer) checkEnd(lim *limitedStream) error {
	lim.limit = min(lim.limit, lim.n+tarSlack)
	for {
		n, err := lim.Read(im.buf)
		for _, c := range im.buf[:n] {
			if c != 0 {
				return im.badArchive(nil, "holds data after the end of its tar stream: refusing it; "+archiveDamaged)
			}
		}
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, errStreamLimit) {
			return im.badArchive(err, fmt.Sprintf("holds more than %d bytes after the end of its tar stream: refusing it; %s", tarSlack, archiveDamaged))
		}
		if err != nil {
			return im.readError(err, "")
		}
	}
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
	case errors.Is(err, errStreamLimit):
		return im.badArchive(err, fmt.Sprintf("decompresses to more than its manifest lists, with the tar's headers and padding%s: refusing it; %s", where, archiveDamaged))
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
