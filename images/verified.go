package images

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// VerifiedName is the image's verification cache: for each file whose
// content was hashed and matched the manifest, the identity of that file on
// disk (device, inode, size, modification and change times). A file whose
// identity is unchanged since is not hashed again, so that restoring a
// large image many times (clones, scale to zero and back) does not read all
// of it each time. The cache is not part of the checksummed content and is
// never exported.
//
// It is a shortcut, not a proof. A write(2) or chmod moves a file's change
// time, which no user call can set back, but a write through a shared
// mapping moves it only when a clean page is first dirtied: a page written
// again before the kernel wrote it back changes the content and not the
// times. So a file changed within the last [cacheQuiet] is never vouched
// for, and --rehash hashes everything. The cache is kept only in a
// directory the caller owns.
const VerifiedName = "verified"

// cacheQuiet is how long a file must have been unchanged before the cache
// vouches for it: the kernel's default dirty-page expiry, after which a page
// dirtied through a mapping is written back and the next write moves the
// file's times again. A variable for tests.
var cacheQuiet = 30 * time.Second

// reservedNames are kcr's own files in an image root, never part of its
// checksummed content.
var reservedNames = map[string]bool{
	ManifestName: true, manifestTmp: true, VerifiedName: true, verifiedTmp: true, GenerationName: true,
	SignatureName: true, signatureTmp: true,
}

// IsReserved reports whether name (slash-separated, relative to the image
// root) is one of kcr's own files in an image.
func IsReserved(name string) bool { return reservedNames[name] }

// GenerationName is the image's restore counter (kept by the engine).
const GenerationName = "restores"

const verifiedTmp = VerifiedName + ".tmp"

type fileID struct {
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime_ns"`
	Ctime int64  `json:"ctime_ns"`
	SHA   string `json:"sha256"`
}

func idOf(fi fs.FileInfo, sha string) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{Dev: uint64(st.Dev), Ino: st.Ino, Size: fi.Size(), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), SHA: sha}, true
}

// quiet reports whether the file was last changed at least cacheQuiet ago.
func (id fileID) quiet(now time.Time) bool {
	return now.Sub(time.Unix(0, max(id.Mtime, id.Ctime))) >= cacheQuiet
}

// readVerified loads the cache; a missing or unreadable one is empty.
func readVerified(root *os.Root) map[string]fileID {
	f, err := root.OpenFile(VerifiedName, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	var m map[string]fileID
	if json.NewDecoder(f).Decode(&m) != nil {
		return nil
	}
	return m
}

// statID returns the identity of the file at path now.
func statID(dir, path, sha string) (fileID, bool) {
	fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(path)))
	if err != nil || !fi.Mode().IsRegular() {
		return fileID{}, false
	}
	return idOf(fi, sha)
}

// ownedByMe reports whether the directory root is owned by the effective
// uid: only then does kcr write its cache or counter into it, because a
// directory of another user may hold links that root would write through.
func ownedByMe(root *os.Root) bool {
	fi, err := root.Lstat(".")
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}

// writeVerified stores the cache, best effort: an image on read-only
// storage, or of another user, is simply hashed every time. It writes
// through root, never through a symlink, into a new file renamed into place.
func writeVerified(root *os.Root, ids map[string]fileID) {
	if !ownedByMe(root) {
		return
	}
	data, err := json.Marshal(ids)
	if err != nil {
		return
	}
	root.Remove(verifiedTmp) // a leftover (or a planted link) is removed, not followed
	f, err := root.OpenFile(verifiedTmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		return
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(verifiedTmp, VerifiedName)
	}
	if err != nil {
		root.Remove(verifiedTmp)
	}
}

// OpenCounter opens (creating it) a small regular file name in the image
// root for the caller to lock and update, through the image root and
// without following symlinks. It refuses when the euid does not own the
// image, for the same reason as the cache.
func OpenCounter(dir, name string) (*os.File, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if !ownedByMe(root) {
		return nil, ErrNotOwned
	}
	f, err := root.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, filePerm)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: errors.New("not a regular file")}
	}
	return f, nil
}

// ErrNotOwned is returned by OpenCounter for an image of another user.
var ErrNotOwned = errors.New("image directory not owned by uid " + strconv.Itoa(os.Geteuid()))

// statIDRoot is statID through root.
func statIDRoot(root *os.Root, path, sha string) (fileID, bool) {
	fi, err := root.Lstat(filepath.FromSlash(path))
	if err != nil || !fi.Mode().IsRegular() {
		return fileID{}, false
	}
	return idOf(fi, sha)
}
