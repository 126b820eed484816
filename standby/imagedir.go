package standby

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/images"
)

// imageDir is the supervisor's directory: images img-NNNNNN (the newest
// complete one is the one to restore), bad-* images set aside, the state
// file, the lock and the control socket.
type imageDir struct {
	path string
	lock *os.File
}

// holdSaved is what the group hold (GroupKeeper) keeps in the state file.
type holdSaved struct {
	// HoldMember is the placeholder's member id while it may be in the
	// group: a kcr standby killed meanwhile left it there, and the next
	// one removes it first.
	HoldMember string `json:"hold_member,omitempty"`
	// HoldProtocol is the assignor the service's group used, which the
	// placeholder offers: the only protocol a classic group keeps for a
	// member across a coordinator change is its selected one, so the
	// placeholder's must be the service's.
	HoldProtocol string `json:"hold_protocol,omitempty"`
}

// persisted is the state file: what a new supervisor with the same
// directory needs to go on (adopt a running service, or restore).
type persisted struct {
	State State  `json:"state"`           // StateRunning or StateStandby
	PID   int    `json:"pid,omitempty"`   // running: the service's host PID
	Start uint64 `json:"start,omitempty"` // running: its start time
	Image string `json:"image,omitempty"` // standby: the image's base name
	// Wake are the wake sources' states (standby), by source: what the
	// Kafka wake needs so that a record that lands while no kcr standby
	// runs still wakes the service.
	Wake map[string]json.RawMessage `json:"wake,omitempty"`
	// LastWake is the breakdown of the last wake (WakePhases).
	LastWake  *WakePhases `json:"last_wake,omitempty"`
	holdSaved             // the group hold's
}

// imageDirFix is the advice when --image-dir or a directory above it is
// open to another user. A volume root that a group may write (2775, as a
// provisioner makes it with an fsGroup) is safe with the sticky bit:
// nobody but its owner and root can then rename or remove the image
// directory in it and put another in its place.
const imageDirFix = "another user could swap the images kcr standby restores as root: chmod +t the directory named (the sticky bit, mode 3775 or 1777: a volume root a group may write), or chmod go-w it"

// openImageDir creates (0700) or opens dir, checks that nobody but the
// caller (or root) controls it or a directory above it, and takes its
// lock: one supervisor per directory.
func openImageDir(dir string) (*imageDir, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("--image-dir %s: %w", dir, err)
	}
	if err := os.Mkdir(abs, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("--image-dir %s: %w: create its parent first", abs, err)
	}
	fi, err := os.Lstat(abs)
	if err != nil {
		return nil, fmt.Errorf("--image-dir %s: %w", abs, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("--image-dir %s: not a directory (a symlink or a file): give a real directory", abs)
	}
	// The directory and everything above it; its entries are checked
	// when they are used (images.OpenWith checks an image before CRIU
	// reads it).
	if err := images.CheckTrustedFix(abs, imageDirFix); err != nil {
		return nil, fmt.Errorf("--image-dir %s: %w", abs, err)
	}
	lf, err := os.OpenFile(filepath.Join(abs, lockFileName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--image-dir %s: lock: %w", abs, err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("--image-dir %s is in use by another kcr standby: give each service a directory of its own", abs)
		}
		return nil, fmt.Errorf("--image-dir %s: lock: %w", abs, err)
	}
	d := &imageDir{path: abs, lock: lf}
	d.removeStateTemps()
	return d, nil
}

// removeStateTemps removes the state file's temporaries a killed kcr
// standby left (writeState's, between their creation and their rename).
// The lock is held: no other writer makes them.
func (d *imageDir) removeStateTemps() {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasPrefix(e.Name(), "."+stateFileName+"-") {
			os.Remove(filepath.Join(d.path, e.Name()))
		}
	}
}

func (d *imageDir) close() { d.lock.Close() }

// imageName is the base name of image number n.
func imageName(n int) string { return fmt.Sprintf("%s%06d", imagePrefix, n) }

// imageNumber parses an image's base name; ok is false for anything else
// (a temporary, a bad image, a file).
func imageNumber(base string) (int, bool) {
	s, ok := strings.CutPrefix(base, imagePrefix)
	if !ok || len(s) < 6 {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// imagesNewestFirst lists the complete images (a manifest is present),
// newest first. Temporaries of an unfinished checkpoint are hidden
// (".img-….kcr-tmp-…") and not listed.
func (d *imageDir) imagesNewestFirst() ([]string, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("read --image-dir %s: %w", d.path, err)
	}
	type img struct {
		n    int
		name string
	}
	var out []img
	for _, e := range ents {
		n, ok := imageNumber(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if _, err := os.Lstat(filepath.Join(d.path, e.Name(), images.ManifestName)); err != nil {
			continue
		}
		out = append(out, img{n, e.Name()})
	}
	slices.SortFunc(out, func(a, b img) int { return b.n - a.n })
	names := make([]string, len(out))
	for i, x := range out {
		names[i] = x.name
	}
	return names, nil
}

// nextImage is the name of the next image: one above every image,
// complete or not, and every bad one.
func (d *imageDir) nextImage() (string, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return "", fmt.Errorf("read --image-dir %s: %w", d.path, err)
	}
	next := 1
	for _, e := range ents {
		// img-N, bad-img-N-UNIXTIME, .img-N.kcr-tmp-RANDOM
		name := strings.TrimPrefix(e.Name(), badPrefix)
		name = strings.TrimPrefix(name, ".")
		if i := strings.Index(name, tempMarker); i >= 0 {
			name = name[:i]
		}
		if i := strings.IndexByte(strings.TrimPrefix(name, imagePrefix), '-'); i >= 0 {
			name = name[:len(imagePrefix)+i]
		}
		if n, ok := imageNumber(name); ok && n >= next {
			next = n + 1
		}
	}
	return imageName(next), nil
}

// recoverPending finishes the images of a checkpoint whose supervisor died
// after CRIU's dump and before the image was published: the service is
// gone then, and its image is all that is left of it.
func (d *imageDir) recoverPending(ctx context.Context) ([]string, error) {
	var done []string
	for _, tmp := range images.FindPending(d.path) {
		img, err := images.Recover(ctx, tmp, nil)
		if err != nil {
			return done, fmt.Errorf("finish the interrupted checkpoint %s: %w", tmp, err)
		}
		done = append(done, filepath.Base(img.Dir))
	}
	return done, nil
}

// removeOlder removes every complete image older than keep, and the hidden
// temporaries of checkpoints that never dumped (images.FindPending took
// those that did).
func (d *imageDir) removeOlder(keep string) error {
	kn, _ := imageNumber(keep)
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if n, ok := imageNumber(name); ok && n < kn {
			errs = append(errs, os.RemoveAll(filepath.Join(d.path, name)))
			continue
		}
		if strings.HasPrefix(name, "."+imagePrefix) && strings.Contains(name, tempMarker) {
			errs = append(errs, os.RemoveAll(filepath.Join(d.path, name)))
		}
	}
	return errors.Join(errs...)
}

// discard removes an image (complete or not) that must never be restored.
func (d *imageDir) discard(name string) {
	if _, ok := imageNumber(name); ok {
		os.RemoveAll(filepath.Join(d.path, name))
	}
}

// setAside renames a bad image to bad-NAME-UNIXTIME, kept for inspection.
func (d *imageDir) setAside(name string) (string, error) {
	to := fmt.Sprintf("%s%s-%d", badPrefix, name, time.Now().Unix())
	if err := os.Rename(filepath.Join(d.path, name), filepath.Join(d.path, to)); err != nil {
		return "", fmt.Errorf("set the bad image %s aside: %w", name, err)
	}
	return to, nil
}

// keepRestoreLog moves the work directory of the failed restore of name
// into its bad image aside, and returns the path of CRIU's log there. A
// restore that failed before CRIU ran (the image did not verify) has no
// log: its work directory is removed, and the path is "".
func (d *imageDir) keepRestoreLog(name, aside string) string {
	work := restoreWorkDir(d.path, name)
	if _, err := os.Lstat(filepath.Join(work, "restore.log")); err != nil {
		os.RemoveAll(work)
		return ""
	}
	to := filepath.Join(d.path, aside, restoreLogDir)
	if err := os.Rename(work, to); err != nil {
		return ""
	}
	return filepath.Join(to, "restore.log")
}

// sweepRestoreWork removes the restore work directories that a killed kcr
// standby left.
func (d *imageDir) sweepRestoreWork() error {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("read --image-dir %s: %w", d.path, err)
	}
	var errs []error
	for _, e := range ents {
		if _, ok := imageNumber(strings.TrimPrefix(e.Name(), restoreWorkPrefix)); ok && e.IsDir() && strings.HasPrefix(e.Name(), restoreWorkPrefix) {
			errs = append(errs, d.removeOwned(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// badImage is an image set aside after a failed restore:
// bad-img-NNNNNN-UNIXTIME (setAside).
type badImage struct {
	name string
	n    int
	at   int64
}

// parseBad parses a bad image's name; ok is false for anything else.
func parseBad(name string) (badImage, bool) {
	rest, ok := strings.CutPrefix(name, badPrefix)
	i := strings.LastIndexByte(rest, '-')
	if !ok || i < 0 {
		return badImage{}, false
	}
	n, ok := imageNumber(rest[:i])
	at, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if !ok || err != nil {
		return badImage{}, false
	}
	return badImage{name, n, at}, true
}

// removingMarker ends the hidden name a bad image is renamed to before it
// is removed: the rename is atomic, so no half-removed image is ever left
// under a bad image's name, and the next pruneBad finishes a removal that
// was cut short.
const removingMarker = ".kcr-rm"

// pruneBad keeps the newest keep images set aside (by the time they were
// set aside, then by number; keep < 0 keeps none), removes the others and
// finishes the removals cut short, and returns the names it removed.
func (d *imageDir) pruneBad(keep int) ([]string, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("read --image-dir %s: %w", d.path, err)
	}
	var bad []badImage
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "."+badPrefix) && strings.HasSuffix(e.Name(), removingMarker) {
			errs = append(errs, d.removeOwned(e.Name()))
		} else if b, ok := parseBad(e.Name()); ok {
			bad = append(bad, b)
		}
	}
	slices.SortFunc(bad, func(a, b badImage) int { return cmp.Or(cmp.Compare(b.at, a.at), cmp.Compare(b.n, a.n)) })
	var removed []string
	for _, b := range bad[min(max(keep, 0), len(bad)):] {
		if err := d.checkOwned(b.name); err != nil {
			errs = append(errs, err)
			continue
		}
		hidden := "." + b.name + removingMarker
		if err := os.Rename(filepath.Join(d.path, b.name), filepath.Join(d.path, hidden)); err != nil {
			errs = append(errs, fmt.Errorf("remove the bad image %s: %w", b.name, err))
			continue
		}
		if err := d.removeOwned(hidden); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, b.name)
	}
	return removed, errors.Join(errs...)
}

// checkOwned refuses to remove an entry of the directory that is a
// directory another uid owns: the supervisor's own bad images are its
// own. A symlink is fine: removing it unlinks the link, never its target.
func (d *imageDir) checkOwned(name string) error {
	fi, err := os.Lstat(filepath.Join(d.path, name))
	if err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); fi.IsDir() && ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("remove %s in --image-dir %s: owned by uid %d, not by kcr (uid %d): left as it is; remove it by hand", name, d.path, st.Uid, os.Geteuid())
	}
	return nil
}

// removeOwned removes an entry of the directory after checkOwned.
// os.RemoveAll opens each directory below with O_NOFOLLOW and unlinks
// relative to it, so it never follows a symlink, wherever it points.
func (d *imageDir) removeOwned(name string) error {
	if err := d.checkOwned(name); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(d.path, name)); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

// readState reads the state file; a missing one is the zero value.
func (d *imageDir) readState() (persisted, error) {
	var p persisted
	f, err := os.OpenFile(filepath.Join(d.path, stateFileName), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("read the state file: %w", err)
	}
	defer f.Close()
	if err := json.NewDecoder(f).Decode(&p); err != nil {
		return persisted{}, fmt.Errorf("read the state file %s: %w", f.Name(), err)
	}
	return p, nil
}

// writeState replaces the state file atomically (a new file renamed over
// it), so that a crash leaves the old or the new one.
func (d *imageDir) writeState(p persisted) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(d.path, "."+stateFileName+"-*")
	if err != nil {
		return fmt.Errorf("write the state file: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(d.path, stateFileName))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write the state file: %w", err)
	}
	return nil
}

// size returns the bytes of the files under the image.
func (d *imageDir) size(name string) int64 {
	var n int64
	filepath.WalkDir(filepath.Join(d.path, name), func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// tempMarker is in the name of the hidden temporary of an unpublished
// image (images.Create).
const tempMarker = ".kcr-tmp-"
