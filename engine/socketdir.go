package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// makeSocketDir creates the directory of an image's control socket when it
// is missing, so that CRIU can bind the socket again at its path: a new
// container's root (kcr standby's image on a volume, restored in a new
// pod) or a rebooted host's /run lack it, and CRIU's restore fails without
// it. The directories are created only below an existing directory that
// root (or this process's user) owns and nobody else may write; the
// socket's own directory is 0700 and the service's (uid), as notify makes
// it. An existing directory is left as it is.
func makeSocketDir(socket string, uid int) error {
	if socket == "" || !filepath.IsAbs(socket) {
		return nil
	}
	dir := filepath.Dir(filepath.Clean(socket))
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err == nil {
			if !trustedDir(fi) {
				return nil // CRIU reports the missing directory itself
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || d == "/" {
			return nil
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		mode := os.FileMode(0o755)
		if d == dir {
			mode = 0o700
		}
		if err := os.Mkdir(d, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("restore: the control socket's directory %s: %w", d, err)
		}
		if d == dir && uid != os.Geteuid() {
			if err := os.Lchown(d, uid, -1); err != nil {
				return fmt.Errorf("restore: the control socket's directory %s: %w", d, err)
			}
		}
	}
	return nil
}

// trustedDir: a directory of root or of this process's user, that no one
// else may write.
func trustedDir(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return false
	}
	return st.Uid == 0 || int(st.Uid) == os.Geteuid()
}
