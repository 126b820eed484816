package standby

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// Lazy restore (Options.Lazy): the wake restores the service's memory on
// demand through CRIU's lazy-pages daemon, which copies the rest in the
// background, so that the wake does not grow with the service's RSS. The
// daemon reads the image until it has copied every page: the next
// checkpoint, which replaces the image, waits for it.

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
