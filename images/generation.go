package images

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NextGeneration increments the image's restore counter under a lock, so
// that concurrent restores of one image get distinct generations. The
// counter ("restores", not part of the manifest: restores do not change
// what was checkpointed) lives in the image when kcr's user owns it, else
// in a state directory of kcr's own, keyed by the image's device and inode:
// never written into a directory another user controls.
func NextGeneration(dir string) (uint64, error) {
	p := filepath.Join(dir, GenerationName)
	f, err := OpenCounter(dir, GenerationName)
	if errors.Is(err, ErrNotOwned) {
		p, f, err = stateCounter(dir)
	}
	if err != nil {
		return 0, fmt.Errorf("restore counter %s: %w", p, err)
	}
	return bumpCounter(p, f)
}

// bumpCounter increments the counter in f (named p) under a lock and
// closes it.
func bumpCounter(p string, f *os.File) (uint64, error) {
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return 0, fmt.Errorf("lock restore counter %s: %w", p, err)
	}
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	cur, _ := strconv.ParseUint(strings.TrimSpace(string(b[:n])), 10, 64)
	cur++
	if err := f.Truncate(0); err != nil {
		return 0, err
	}
	if _, err := f.WriteAt([]byte(strconv.FormatUint(cur, 10)+"\n"), 0); err != nil {
		return 0, fmt.Errorf("write restore counter %s: %w", p, err)
	}
	return cur, f.Sync()
}

// stateCounter opens the restore counter of a file or an image kcr's
// user does not own, in /run/kcr-state (root) or $TMPDIR/kcr-state-UID, which must be
// kcr's user's own and closed to others.
func stateCounter(image string) (string, *os.File, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return image, nil, err
	}
	dir := "/run/kcr-state"
	if os.Geteuid() != 0 {
		dir = filepath.Join(os.TempDir(), "kcr-state-"+strconv.Itoa(os.Geteuid()))
	}
	p := filepath.Join(dir, fmt.Sprintf("%d-%d.%s", st.Dev, st.Ino, GenerationName))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, nil, err
	}
	var ds unix.Stat_t
	if err := unix.Lstat(dir, &ds); err != nil {
		return p, nil, err
	}
	if ds.Mode&unix.S_IFMT != unix.S_IFDIR || int(ds.Uid) != os.Geteuid() || ds.Mode&0o022 != 0 {
		return p, nil, fmt.Errorf("state directory %s is not a directory of uid %d closed to others: remove it", dir, os.Geteuid())
	}
	f, err := OpenCounter(dir, filepath.Base(p))
	return p, f, err
}

// NextFileGeneration counts the restores of a file (a checkpoint archive)
// in kcr's state directory, keyed by its device and inode, and returns the
// new count.
func NextFileGeneration(file string) (uint64, error) {
	p, f, err := stateCounter(file)
	if err != nil {
		return 0, fmt.Errorf("restore counter %s: %w", p, err)
	}
	return bumpCounter(p, f)
}
