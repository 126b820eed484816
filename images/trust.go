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
	return checkOwnerFix(dir, p, fi, ancestor, untrustedFix)
}

// checkOwnerFix is checkOwner with the fix its errors suggest.
func checkOwnerFix(dir, p string, fi fs.FileInfo, ancestor bool, fix string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return newError(dir, p, ErrUntrusted, nil, fmt.Sprintf("%s: no owner information; %s", p, fix))
	}
	what := p
	if what == "." {
		what = "the image directory"
	}
	uid := int(st.Uid)
	if uid != os.Geteuid() && uid != 0 {
		return newError(dir, p, ErrUntrusted, nil, fmt.Sprintf("%s belongs to uid %d; %s", what, uid, fix))
	}
	if fi.Mode().Type() == fs.ModeSymlink {
		return nil // the walk does not follow it, and checkEntry refuses it
	}
	if fi.Mode().Perm()&0o022 != 0 && !(ancestor && uid == 0 && fi.Mode()&fs.ModeSticky != 0) {
		return newError(dir, p, ErrUntrusted, nil, fmt.Sprintf("%s has mode %04o (writable by group or others); %s", what, fi.Mode().Perm(), fix))
	}
	return nil
}

// checkAncestors applies the owner rule to every directory above dir,
// after resolving its links (see OpenTrustedDir): whoever may rename one
// of them may put another image in its place.
func checkAncestors(dir string) error { return checkAncestorsFix(dir, untrustedFix) }

// checkAncestorsFix is checkAncestors with the fix its errors suggest.
func checkAncestorsFix(dir, fix string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("images: %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("images: %s: %w", dir, err)
	}
	d, _, err := openDir(filepath.Dir(real), true, fix)
	if e, ok := errors.AsType[*Error](err); ok {
		e.Dir = dir
		return e
	}
	if err != nil {
		return fmt.Errorf("images: %s: %w", dir, err)
	}
	return d.Close()
}

// recoverFix is the advice when Recover refuses a directory.
const recoverFix = "kcr recover publishes (and with --sign signs) whatever is in it: run kcr recover as that user, or chown -R and chmod -R go-w it first if you trust that user"

// checkTree refuses a directory that a user other than the caller or root
// could have written: it, an entry in it or an ancestor (as checkOwner),
// once its links are resolved. It returns the resolved path, which the
// caller uses from then on: a link above it could be changed.
func checkTree(dir, fix string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("images: %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("images: %s: %w", dir, err)
	}
	if err := checkAncestorsFix(real, fix); err != nil {
		if e, ok := errors.AsType[*Error](err); ok {
			e.Dir = dir
		}
		return "", err
	}
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("images: %s: %w", dir, err)
		}
		fi, err := d.Info() // lstat
		if err != nil {
			return fmt.Errorf("images: %s: %w", dir, err)
		}
		rel, _ := filepath.Rel(real, p)
		return checkOwnerFix(dir, filepath.ToSlash(rel), fi, false, fix)
	})
	return real, err
}

// CheckTrusted applies the check of [OpenOptions.Trusted] to a file or
// directory tree that is not an image yet, such as a checkpoint archive or
// an OCI layout to restore from: it, every entry and every ancestor must be
// the caller's or root's, and not writable by group or others. Links in p
// are resolved first, and the resolved path checked.
func CheckTrusted(p string) error {
	_, err := checkTree(p, untrustedFix)
	return err
}

// CheckTrustedFix is CheckTrusted with fix as the advice of its
// ErrUntrusted errors, for a caller whose user has no --allow-untrusted.
func CheckTrustedFix(p, fix string) error {
	_, err := checkTree(p, fix)
	return err
}

// ResolveTrusted is CheckTrusted that returns the resolved path checked:
// the caller must use that path, not p, whose links could change.
func ResolveTrusted(p string) (string, error) { return checkTree(p, untrustedFix) }
