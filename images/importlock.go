package images

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// importMark names a file in an import's temporary directory: it says the
// directory is an import's (a checkpoint's is left for "kcr recover"), and
// the import holds a flock on the directory for as long as it runs.
const importMark = ".kcr-import"

// lockImport marks tmp as an import in progress and locks it; the lock goes
// with the returned file, or with the process.
func lockImport(tmp string) (*os.File, error) {
	d, err := os.Open(tmp)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		d.Close()
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(tmp, importMark), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, filePerm)
	if err != nil {
		d.Close()
		return nil, err
	}
	f.Close()
	return d, nil
}

// removeStaleImports removes, in parent, the temporary directories of
// imports that were killed: marked as an import, owned by the effective
// uid, and not locked by a live import. It reports what it removed.
func removeStaleImports(parent string) []string {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".") || !isTempName(e.Name()) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if !staleImport(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			slog.Warn("images: cannot remove a killed import's temporary directory", "dir", dir, "err", err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed
}

func staleImport(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return false
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false // a live import holds it
	}
	// The mark, looked up through the locked fd: no symlink followed.
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), importMark, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	return true
}

// errNoLock explains a failed lock on a fresh temporary directory.
func errNoLock(final string, err error) error {
	if errors.Is(err, unix.EWOULDBLOCK) {
		err = fmt.Errorf("locked by another process: %w", err)
	}
	return fmt.Errorf("images: %s: lock temporary directory: %w", final, err)
}
