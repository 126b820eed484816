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

// OpenTrustedDir opens the directory dir for root-kcr to read or write in:
// it resolves dir's symlinks once, then walks the resolved path from "/"
// without following any link, and refuses (ErrUntrusted, with fix) a
// directory on the way, dir included, that belongs to a uid other than the
// caller's or root, or that group or others can write (unless it is a
// sticky directory of root's, like /tmp). It returns the directory's fd
// (O_RDONLY|O_DIRECTORY) and the resolved path.
func OpenTrustedDir(dir, fix string) (*os.File, string, error) {
	return openDir(dir, true, fix)
}

// openDir is OpenTrustedDir; with check false it only refuses links on the
// way (after the resolution), for a caller that is not root.
func openDir(dir string, check bool, fix string) (*os.File, string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, "", fmt.Errorf("images: %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, "", err
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", err
	}
	comps := strings.Split(strings.TrimPrefix(real, "/"), "/")
	if real == "/" {
		comps = nil
	}
	walked := "/"
	for i := 0; ; i++ {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, "", err
		}
		if check {
			if why := trustStat(st.Uid, st.Mode, true); why != "" {
				unix.Close(fd)
				return nil, "", newError(dir, walked, ErrUntrusted, nil, fmt.Sprintf("%s %s; %s", walked, why, fix))
			}
		}
		if i == len(comps) {
			break
		}
		nfd, err := unix.Openat(fd, comps[i], unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, "", newError(dir, walked, ErrUntrusted, err,
				fmt.Sprintf("%s changed while it was opened (it is now a link or not a directory); %s", filepath.Join(walked, comps[i]), fix))
		}
		if err != nil {
			return nil, "", &fs.PathError{Op: "open", Path: filepath.Join(walked, comps[i]), Err: err}
		}
		fd = nfd
		walked = filepath.Join(walked, comps[i])
	}
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(fd)
	if err != nil {
		return nil, "", &fs.PathError{Op: "open", Path: real, Err: err}
	}
	return os.NewFile(uintptr(rfd), real), real, nil
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

// OpenTrustedRoot is OpenTrustedDir as an os.Root.
func OpenTrustedRoot(dir, fix string) (*os.Root, string, error) {
	d, real, err := OpenTrustedDir(dir, fix)
	if err != nil {
		return nil, "", err
	}
	defer d.Close()
	root, err := rootOf(d)
	return root, real, err
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
