package criu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// KdatPath is where CRIU, run as root, keeps its kernel probe (kerndat)
// between runs. It reads that file wherever it is, but writes it only when
// its directory is a tmpfs (so that a reboot drops it): elsewhere every
// CRIU run probes the kernel again (25-30 ms).
const KdatPath = "/run/criu.kdat"

// KdatCache is a kernel probe kept for CRIU at KdatPath, on a host whose
// /run is not a tmpfs.
type KdatCache struct {
	file         string // the probe, in the caller's directory
	target       string
	created      bool // target was created as a mount point
	mounted      bool
	TmpfsAlready bool // /run is a tmpfs: CRIU keeps its probe itself
}

// CacheKdat makes every CRIU run load its kernel probe from a file instead
// of probing again, until Release: where /run is not a tmpfs (most
// containers), it runs CRIU once in a mount namespace of its own whose /run
// is a tmpfs, keeps the probe it writes as dir/criu.kdat (dir must be the
// caller's own, 0700), and bind-mounts that file on KdatPath. A mount, unlike
// a file, does not outlive a reboot, so no later kernel reads this one's
// probe; the empty file left as its mount point reads as stale to CRIU,
// which then probes again. Where /run is a tmpfs it does nothing (CRIU keeps
// its probe there itself). Root only.
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
	k := &KdatCache{file: filepath.Join(dir, "criu.kdat"), target: KdatPath}
	if err := writeFileAtomic(k.file, probe); err != nil {
		return nil, fmt.Errorf("kdat cache: %w", err)
	}
	if err := k.mount(); err != nil {
		k.Release()
		return nil, err
	}
	return k, nil
}

// mount bind-mounts the probe on the target, creating the target as an
// empty file if it is missing. Another kcr releasing its own cache may
// remove the target in between: it tries again.
func (k *KdatCache) mount() error {
	var err error
	for range 5 {
		if err = k.mountOnce(); !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return err
}

func (k *KdatCache) mountOnce() error {
	f, err := os.OpenFile(k.target, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
	switch {
	case err == nil:
		f.Close()
		k.created = true
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("kdat cache: %w", err)
	}
	fi, err := os.Lstat(k.target)
	if err != nil {
		return fmt.Errorf("kdat cache: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("kdat cache: %s is a %s, not a file: remove it", k.target, fi.Mode().Type())
	}
	if err := unix.Mount(k.file, k.target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("kdat cache: bind-mounting %s on %s: %w", k.file, k.target, err)
	}
	k.mounted = true
	return nil
}

// Release removes one bind mount from the target, the mount point if it
// created it and no other kcr's mount is on it, and the probe file. Other
// kcr processes stack their own mounts of the same probe on the target;
// each removes one. A nil or no-op cache is fine.
func (k *KdatCache) Release() {
	if k == nil || k.file == "" {
		return
	}
	if k.mounted {
		unix.Unmount(k.target, unix.MNT_DETACH)
		k.mounted = false
	}
	if k.created {
		// Another cache's mount still on it keeps it (EBUSY); left empty,
		// it reads as stale to CRIU.
		os.Remove(k.target)
		k.created = false
	}
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
