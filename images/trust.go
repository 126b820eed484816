package images

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUntrusted: the image could have been written by a user other than the
// caller's (or root), see [OpenOptions.Trusted].
var ErrUntrusted = errors.New("image writable by another user")

// untrustedFix is the advice in every ErrUntrusted message.
const untrustedFix = "CRIU as root would run whatever that user wrote into it: chown -R root: the image and chmod -R go-w it, or pass --allow-untrusted if you trust that user"

// checkOwner refuses an entry owned by a uid other than the caller's or
// root, or writable by group or others. Ancestors may be root's sticky
// directories, like /tmp.
func checkOwner(dir, p string, fi fs.FileInfo, ancestor bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return newError(dir, p, ErrUntrusted, nil, fmt.Sprintf("%s: no owner information; %s", p, untrustedFix))
	}
	what := p
	if what == "." {
		what = "the image directory"
	}
	uid := int(st.Uid)
	if uid != os.Geteuid() && uid != 0 {
		return newError(dir, p, ErrUntrusted, nil, fmt.Sprintf("%s belongs to uid %d; %s", what, uid, untrustedFix))
	}
	if fi.Mode().Type() == fs.ModeSymlink {
		return nil // the walk does not follow it, and checkEntry refuses it
	}
	if fi.Mode().Perm()&0o022 != 0 && !(ancestor && uid == 0 && fi.Mode()&fs.ModeSticky != 0) {
		return newError(dir, p, ErrUntrusted, nil, fmt.Sprintf("%s has mode %04o (writable by group or others); %s", what, fi.Mode().Perm(), untrustedFix))
	}
	return nil
}

// checkAncestors applies checkOwner to every directory above dir: whoever
// may rename one of them may put another image in its place.
func checkAncestors(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("images: %s: %w", dir, err)
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("images: %s: %w", dir, err)
		}
		if err := checkOwner(dir, p, fi, true); err != nil {
			return err
		}
		if p == "/" {
			return nil
		}
	}
}
