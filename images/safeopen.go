package images

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The path rule of root-kcr (docs/security-paths.md): a path is resolved
// once, then walked from "/" one component at a time with O_NOFOLLOW, and
// every directory on the way must belong to root or the caller's uid and be
// closed to writes by group and others (a sticky directory of root's, like
// /tmp, is allowed). What is then read or written is opened relative to the
// last directory's fd, never by path again.

// outputFix is the advice when an output's directory is refused.
const outputFix = "another user could swap in what kcr writes (and signs): write into a directory that only root (or you) can write, e.g. chown root: it and chmod go-w it"

// trustStat applies the owner rule to one stat: "" if it passes, else why
// not. A sticky directory of root's passes when sticky is true.
func trustStat(owner, mode uint32, sticky bool) string {
	uid := int(owner)
	if uid != os.Geteuid() && uid != 0 {
		return fmt.Sprintf("belongs to uid %d", uid)
	}
	if mode&0o022 != 0 && !(sticky && uid == 0 && mode&unix.S_ISVTX != 0) {
		return fmt.Sprintf("has mode %04o (writable by group or others)", mode&0o7777)
	}
	return ""
}

// trustInfo is trustStat for a FileInfo of os.
func trustInfo(fi fs.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "has no owner information"
	}
	return trustStat(st.Uid, st.Mode, false)
}

// OpenTrustedDir opens the directory dir for root-kcr to read or write in.
// It walks dir from "/" one component at a time, without following links
// by path: a link is followed only if it belongs to root or the caller
// (its directory having passed already), since only its directory's
// writers can change where it points. It refuses (ErrUntrusted, with fix)
// a directory on the way, dir included, or a link, that belongs to a uid
// other than the caller's or root, or a directory that group or others
// can write (unless it is a sticky directory of root's, like /tmp). It
// returns the directory's fd (O_RDONLY|O_DIRECTORY) and the path walked,
// links resolved.
func OpenTrustedDir(dir, fix string) (*os.File, string, error) {
	return openDir(dir, true, fix)
}

// maxLinks bounds the links followed in one walk, as the kernel's 40.
const maxLinks = 40

// openDir is OpenTrustedDir; with check false it applies no owner rule
// and follows every link, for a caller that is not root.
func openDir(dir string, check bool, fix string) (*os.File, string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, "", fmt.Errorf("images: %s: %w", dir, err)
	}
	w := &dirWalk{dir: dir, check: check, fix: fix, fd: -1, rest: strings.Split(abs, "/")} // abs starts with "/": rest[0] is ""
	defer w.close()
	for len(w.rest) > 0 {
		if w.rest[0] == "" { // start again from "/"
			w.rest = w.rest[1:]
			if err := w.fromRoot(); err != nil {
				return nil, "", err
			}
			continue
		}
		c := w.rest[0]
		w.rest = w.rest[1:]
		switch c {
		case ".":
			continue
		case "..":
			// Lexically, as filepath.Clean would: the walk never goes up
			// through a directory it did not come down.
			w.rest = append(strings.Split(filepath.Dir(w.walked), "/"), w.rest...)
			continue
		}
		if err := w.step(c); err != nil {
			return nil, "", err
		}
	}
	rfd, err := unix.Openat(w.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", &fs.PathError{Op: "open", Path: w.walked, Err: err}
	}
	return os.NewFile(uintptr(rfd), w.walked), w.walked, nil
}

// dirWalk is openDir's walk down a path, one component at a time, each
// opened O_PATH|O_NOFOLLOW under the last: fd is the directory reached
// (-1 before the start), walked its path, rest the components to go.
type dirWalk struct {
	dir    string // as the caller gave it, for errors
	check  bool
	fix    string
	fd     int
	walked string
	rest   []string
	links  int // links followed so far, up to maxLinks
}

// close closes the directory reached, if any.
func (w *dirWalk) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
	}
}

// untrusted is the error for a directory or link on the way that another
// user could change.
func (w *dirWalk) untrusted(p, why string) error {
	return newError(w.dir, p, ErrUntrusted, nil, fmt.Sprintf("%s %s; %s", p, why, w.fix))
}

// fromRoot starts the walk again from "/", checking it.
func (w *dirWalk) fromRoot() error {
	w.close()
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		w.fd = -1
		return err
	}
	w.fd, w.walked = fd, "/"
	var st unix.Stat_t
	if err := unix.Fstat(w.fd, &st); err != nil {
		return err
	}
	if why := trustStat(st.Uid, st.Mode, true); w.check && why != "" {
		return w.untrusted(w.walked, why)
	}
	return nil
}

// step goes down to the component c of the directory reached: a directory
// becomes the one reached, a link's target is put before the rest.
func (w *dirWalk) step(c string) error {
	next := filepath.Join(w.walked, c)
	nfd, err := unix.Openat(w.fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: next, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		unix.Close(nfd)
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		defer unix.Close(nfd)
		return w.followLink(c, next, st.Uid)
	case unix.S_IFDIR:
	default:
		unix.Close(nfd)
		return &fs.PathError{Op: "open", Path: next, Err: unix.ENOTDIR}
	}
	if why := trustStat(st.Uid, st.Mode, true); w.check && why != "" {
		unix.Close(nfd)
		return w.untrusted(next, why)
	}
	unix.Close(w.fd)
	w.fd, w.walked = nfd, next
	return nil
}

// followLink puts the target of the link c (at next, owned by uid) before
// the rest of the walk.
func (w *dirWalk) followLink(c, next string, uid uint32) error {
	if w.links++; w.links > maxLinks {
		return &fs.PathError{Op: "open", Path: next, Err: unix.ELOOP}
	}
	if why := trustStat(uid, 0, false); w.check && why != "" {
		return w.untrusted(next+" (a link)", why)
	}
	target, err := readlinkat(w.fd, c)
	if err != nil {
		return &fs.PathError{Op: "readlink", Path: next, Err: err}
	}
	w.rest = append(linkComponents(target), w.rest...)
	return nil
}

// linkComponents splits a link's target into the components the walk
// takes, a leading "" (start again from "/") for an absolute one; empty
// components ("a//b", "a/") are dropped, as the kernel skips them, so they
// never read as a new start from "/".
func linkComponents(target string) []string {
	var out []string
	if strings.HasPrefix(target, "/") {
		out = append(out, "")
	}
	for _, c := range strings.Split(target, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// readlinkat reads the link name in the directory fd.
func readlinkat(fd int, name string) (string, error) {
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		m, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return "", err
		}
		if m < n {
			return string(buf[:m]), nil
		}
	}
}

// rootOf opens an os.Root on the directory d (an fd, not a path that could
// be swapped) and checks that it is that same directory.
func rootOf(d *os.File) (*os.Root, error) {
	root, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(int(d.Fd())))
	if err != nil {
		return nil, err
	}
	a, err1 := d.Stat()
	b, err2 := root.Stat(".")
	if err := errors.Join(err1, err2); err != nil || !os.SameFile(a, b) {
		root.Close()
		return nil, fmt.Errorf("%s: the directory changed while it was opened: %w", d.Name(), errors.Join(err, fs.ErrInvalid))
	}
	return root, nil
}

// OpenOutput opens the file path for root-kcr to write to: in a directory
// that passes OpenTrustedDir when kcr runs as root (else any directory,
// links resolved), never through a symlink, FIFO or device. With appendTo
// it appends (creating the file); else it creates a new file and refuses
// an existing one (never truncating). The file is created mode 0600.
func OpenOutput(path string, appendTo bool, fix string) (*os.File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	parent, base := filepath.Split(abs)
	if base == "" {
		return nil, fmt.Errorf("%s: not a file name", path)
	}
	d, _, err := openDir(parent, os.Geteuid() == 0, fix)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	if appendTo {
		flags |= unix.O_APPEND
	} else {
		flags |= unix.O_EXCL
	}
	fd, err := unix.Openat(int(d.Fd()), base, flags, filePerm)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: abs, Err: err}
	}
	f := os.NewFile(uintptr(fd), abs)
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &fs.PathError{Op: "open", Path: abs, Err: fmt.Errorf("a %s, not a regular file", kindOf(fi.Mode()))}
	}
	if err == nil && os.Geteuid() == 0 {
		if why := trustInfo(fi); why != "" {
			err = newError(path, base, ErrUntrusted, nil, fmt.Sprintf("%s %s; %s", abs, why, fix))
		}
	}
	if err == nil {
		err = setBlocking(f)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// setBlocking clears O_NONBLOCK, set to open without waiting on a FIFO.
func setBlocking(f *os.File) error {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return err
}

// ReadTrustedFile reads the regular file path, at most limit bytes: its
// links are resolved once; then, as root, it must be in a directory that
// passes OpenTrustedDir and pass the same owner rule itself. It is opened
// relative to that directory's fd, not through a link, and never waits on
// a FIFO.
func ReadTrustedFile(path string, limit int64, fix string) ([]byte, error) {
	data, _, err := readTrusted(path, limit, fix)
	return data, err
}

// readTrusted is ReadTrustedFile that also returns the file's stat.
func readTrusted(path string, limit int64, fix string) ([]byte, fs.FileInfo, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, nil, err
	}
	parent, base := filepath.Split(real)
	d, _, err := openDir(parent, os.Geteuid() == 0, fix)
	if e, ok := errors.AsType[*Error](err); ok {
		e.Dir = path
		return nil, nil, e
	}
	if err != nil {
		return nil, nil, err
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: abs, Err: err}
	}
	f := os.NewFile(uintptr(fd), abs)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, &fs.PathError{Op: "open", Path: abs, Err: fmt.Errorf("a %s, not a regular file", kindOf(fi.Mode()))}
	}
	if os.Geteuid() == 0 {
		if why := trustInfo(fi); why != "" {
			return nil, fi, newError(path, base, ErrUntrusted, nil, fmt.Sprintf("%s %s; %s", real, why, fix))
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fi, err
	}
	if int64(len(data)) > limit {
		return nil, fi, &fs.PathError{Op: "read", Path: abs, Err: errTooBig}
	}
	return data, fi, nil
}
