package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// KdatPath is where CRIU, run as root, keeps its kernel probe (kerndat)
// between runs. It reads that file wherever it is, but writes it only when
// its directory is a tmpfs (so that a reboot drops it): elsewhere every
// CRIU run probes the kernel again (its cost: docs/benchmarks.md).
const KdatPath = "/run/criu.kdat"

// KdatCache is a kernel probe kept for CRIU at KdatPath, on a host whose
// /run is not a tmpfs.
type KdatCache struct {
	file         string   // the probe, in the caller's directory
	lock         *os.File // shared while this cache is in use; see Release
	TmpfsAlready bool     // /run is a tmpfs: CRIU keeps its probe itself
}

// kdatLock is held (flock) shared by every kcr that uses the probe mounted
// at KdatPath, and exclusive by the last one, which removes it; the kernel
// drops the lock of a kcr that was killed.
const kdatLock = KdatPath + ".kcr-lock"

// CacheKdat makes every CRIU run load its kernel probe from a file instead
// of probing again: where /run is not a tmpfs (most containers), it runs
// CRIU once in a mount namespace of its own whose /run is a tmpfs, keeps
// the probe it writes as dir/criu.kdat (dir must be the caller's own,
// 0700), and bind-mounts that file on KdatPath, unless the same probe is
// mounted there already (by another kcr). The last user's Release removes
// the mount; one left by a kcr that was killed is taken over (or replaced,
// if stale) by the next. A mount, unlike a file, does not outlive a reboot,
// so no later kernel reads this one's probe. Where /run is a tmpfs it does
// nothing (CRIU keeps its probe there itself). Root only.
func CacheKdat(ctx context.Context, criuPath, dir string) (*KdatCache, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(KdatPath), &st); err != nil {
		return nil, fmt.Errorf("kdat cache: statfs %s: %w", filepath.Dir(KdatPath), err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return &KdatCache{TmpfsAlready: true}, nil
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("kdat cache: needs root (CRIU's probe cache is root's)")
	}
	probe, err := probeKdat(ctx, criuPath)
	if err != nil {
		return nil, err
	}
	k := &KdatCache{file: filepath.Join(dir, "criu.kdat")}
	if err := writeFileAtomic(k.file, probe); err != nil {
		return nil, fmt.Errorf("kdat cache: %w", err)
	}
	if k.lock, err = os.OpenFile(kdatLock, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600); err != nil {
		os.Remove(k.file)
		return nil, fmt.Errorf("kdat cache: %w", err)
	}
	if err := unix.Flock(int(k.lock.Fd()), unix.LOCK_SH); err != nil {
		k.Release()
		return nil, fmt.Errorf("kdat cache: lock %s: %w", kdatLock, err)
	}
	if err := k.mount(probe); err != nil {
		k.Release()
		return nil, err
	}
	return k, nil
}

// mount bind-mounts the probe on KdatPath, unless a probe of the same CRIU
// is there (another kcr's): a mount left with another (a stale one) is
// removed first.
func (k *KdatCache) mount(probe []byte) error {
	if kdatMounted() {
		if b, err := os.ReadFile(KdatPath); err == nil && sameCRIU(b, probe) {
			return nil
		}
		unmountKdat()
	}
	f, err := os.OpenFile(KdatPath, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("kdat cache: %w", err)
	}
	f.Close()
	if fi, err := os.Lstat(KdatPath); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("kdat cache: %s is not a regular file (%v): remove it", KdatPath, err)
	}
	if err := unix.Mount(k.file, KdatPath, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("kdat cache: bind-mounting %s on %s: %w", k.file, KdatPath, err)
	}
	return nil
}

// sameCRIU reports whether two probes were written by the same CRIU build
// (on the same boot, as both are read through a mount): CRIU checks a
// probe by its size and its first two words, its magic and its build's.
// Two probes of one build differ in some of their other bytes.
func sameCRIU(a, b []byte) bool {
	return len(a) == len(b) && len(a) >= 8 && bytes.Equal(a[:8], b[:8])
}

// kdatMounted reports whether something is mounted on KdatPath.
func kdatMounted() bool {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == KdatPath {
			return true
		}
	}
	return false
}

// unmountKdat removes every mount on KdatPath and the file under them.
func unmountKdat() {
	for range 1000 {
		if unix.Unmount(KdatPath, unix.MNT_DETACH) != nil {
			break
		}
	}
	os.Remove(KdatPath)
}

// Release ends this kcr's use of the probe: the last user removes the
// mount and its mount point. It removes the probe file (the mount, if it
// stays for another kcr, keeps it readable). A nil or no-op cache is fine.
func (k *KdatCache) Release() {
	if k == nil || k.lock == nil {
		return
	}
	if unix.Flock(int(k.lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		unmountKdat()
	}
	k.lock.Close() // drops the lock
	k.lock = nil
	os.Remove(k.file)
}

// probeKdat runs "criu check" in a mount namespace of its own, with a tmpfs
// on /run, and returns the probe CRIU wrote there. The namespace belongs to
// one OS thread, which goes back to the process's namespace and working
// directory afterwards, or, if it cannot, is never used again.
func probeKdat(ctx context.Context, criuPath string) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		b, err := probeOnThread(ctx, criuPath)
		ch <- result{b, err}
	}()
	r := <-ch
	return r.b, r.err
}

// probeOnThread runs on a locked thread and unlocks it only once it is
// back in the namespace and directory it started in.
func probeOnThread(ctx context.Context, criuPath string) ([]byte, error) {
	orig, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("kdat cache: %w", err)
	}
	defer orig.Close()
	wd, err := os.Getwd()
	if err != nil {
		return nil, fmt.Errorf("kdat cache: %w", err)
	}
	defer func() {
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNS) == nil && unix.Chdir(wd) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return probeInNamespace(ctx, criuPath)
}

func probeInNamespace(ctx context.Context, criuPath string) ([]byte, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("kdat cache: unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("kdat cache: private mounts: %w", err)
	}
	run := filepath.Dir(KdatPath)
	if err := unix.Mount("kcr-kdat", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		return nil, fmt.Errorf("kdat cache: tmpfs on %s: %w", run, err)
	}
	// Started from this thread, CRIU is in its namespace.
	out, err := exec.CommandContext(ctx, criuPath, "check").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kdat cache: criu check: %w: %s", err, firstLine(string(out)))
	}
	b, err := os.ReadFile(KdatPath)
	if err != nil {
		return nil, fmt.Errorf("kdat cache: criu check wrote no probe: %w", err)
	}
	return b, nil
}

// writeFileAtomic writes b to path (0600) through a temporary file.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// firstLine returns the first line of s.
func firstLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
