package standby

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/procfs"
)

// Lazy restore (Options.Lazy, Options.LazyAbove): the wake restores the service's memory on
// demand through CRIU's lazy-pages daemon, which copies the rest in the
// background, so that the wake does not grow with the service's RSS. The
// daemon reads the image until it has copied every page: the next
// checkpoint, which replaces the image, waits for it.

// lazyFor reports whether the image dir/name is restored lazily: always
// with Options.Lazy, else when its memory pages reach Options.LazyAbove
// and kcr may use userfaultfd. An image whose manifest does not read is
// restored eagerly: its restore reports what is wrong with it.
func (b *engineBackend) lazyFor(dir, name string) bool {
	if b.o.Lazy {
		return true
	}
	if b.o.LazyAbove < 0 {
		return false
	}
	m, err := images.ReadManifest(filepath.Join(dir, name))
	if err != nil {
		return false
	}
	pages := m.PagesSize()
	lazy := pages >= b.o.LazyAbove
	if lazy && !uffdUsable() {
		b.log.Warn("standby: restoring eagerly: userfaultfd is not available to kcr (seccomp, vm.unprivileged_userfaultfd or a kernel without it)",
			"image", name, "pages_mib", pages>>20)
		return false
	}
	b.log.Debug("standby: restore mode chosen by the image's memory", "image", name, "lazy", lazy,
		"pages_mib", pages>>20, "lazy_above_mib", b.o.LazyAbove>>20)
	return lazy
}

// uffdUsable reports whether this process may create a userfaultfd, as
// the CRIU it runs must for a lazy restore.
var uffdUsable = sync.OnceValue(func() bool {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		return false
	}
	unix.Close(int(fd))
	return true
})

// lazyWorkDir is the lazy-pages daemon's work directory for the image name.
func lazyWorkDir(dir, name string) string { return filepath.Join(dir, "lazy-"+name) }

// restoreWorkDir is the work directory of the image name's restore: it
// holds CRIU's log, which a failed restore leaves and the image set aside
// takes along (restoreLogDir).
func restoreWorkDir(dir, name string) string { return filepath.Join(dir, restoreWorkPrefix+name) }

// restoreLogDir is where a bad image keeps its failed restore's work
// directory.
const restoreLogDir = "restore-log"

// noteLazy records the lazy-pages daemon a restore left running.
func (b *engineBackend) noteLazy(pid int, work string) {
	b.lazy, b.lazyWork = proc{}, work
	if st, err := procfs.StartTime(pid); err == nil {
		b.lazy = proc{PID: pid, Start: st}
	}
}

// waitLazy waits, before a checkpoint, for the lazy-pages daemon of the
// last restore to have copied every page and exited, then removes its work
// directory. It returns ctx's error if ctx ends first.
func (b *engineBackend) waitLazy(ctx context.Context) error {
	if b.lazyWork == "" {
		return nil
	}
	for b.lazy.PID > 0 && alive(b.lazy) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	os.RemoveAll(b.lazyWork)
	b.lazy, b.lazyWork = proc{}, ""
	return nil
}
