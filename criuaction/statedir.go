package criuaction

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxStateFile bounds what is read of a state or generation file.
const maxStateFile = 1 << 20

// defaultStateDir is /run/kcr/criu-hook for root; for another user
// $XDG_RUNTIME_DIR/kcr-criu-hook (a directory of that user's alone), else
// $TMPDIR/kcr-criu-hook-UID.
func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/run/kcr/criu-hook"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		return filepath.Join(d, "kcr-criu-hook")
	}
	return filepath.Join(os.TempDir(), "kcr-criu-hook-"+strconv.Itoa(os.Geteuid()))
}

// openStateDir opens the state directory dir, creating it (0700) if
// create; it must be a directory, not a link, of the effective uid and not
// writable by group or others: another user could otherwise plant links
// in it, or forge the state and the generations.
func openStateDir(dir string, create bool) (*os.Root, error) {
	if create {
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return nil, fmt.Errorf("criu-hook state directory: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("criu-hook state directory: %w", err)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("criu-hook state directory %s: %w (it must be a directory, not a link)", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("criu-hook state directory %s belongs to uid %d with mode %04o: not a directory of uid %d closed to others; remove it (another user may have made it)", dir, st.Uid, st.Mode&0o7777, os.Geteuid())
	}
	root, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, err
	}
	if fi, err := root.Stat("."); err != nil || fi.Sys().(*syscall.Stat_t).Ino != st.Ino {
		root.Close()
		return nil, fmt.Errorf("criu-hook state directory %s changed while it was opened", dir)
	}
	return root, nil
}

// writeStateFile writes data as name in root: a new file (O_EXCL, not
// through a link), renamed into place.
func writeStateFile(root *os.Root, name string, data []byte) error {
	tmp := name + ".tmp"
	if err := root.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
	}
	return err
}

// readStateFile reads the regular file name of root, not through a link,
// not waiting on a FIFO, at most maxStateFile bytes.
func readStateFile(root *os.Root, name string) ([]byte, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("criu-hook state %s: not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err == nil && len(b) > maxStateFile {
		err = fmt.Errorf("criu-hook state %s: larger than %d bytes", name, maxStateFile)
	}
	return b, err
}
