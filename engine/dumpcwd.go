package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// parasiteProcDir is where CRIU's parasite mounts a proc of the dumped
// process's PID namespace, relative to the process's working directory,
// when the process's /proc is not its namespace's (init of a PID namespace
// of its own, as kcr run starts services): it creates the directory, mounts,
// opens, detaches and removes it, all within the dump.
const parasiteProcDir = "proc.crtools"

// cwdLockWait bounds how long a dump waits for another dump of a process
// with the same working directory (seconds at most); the app is quiesced
// meanwhile, so past it the dump goes on without the lock.
const cwdLockWait = 10 * time.Second

// lockDumpCwd serializes the dumps of processes that share a working
// directory and run in PID namespaces of their own: two at once collide on
// parasiteProcDir (CRIU: "Can't create a directory (-17)"). The lock is a
// flock on the directory itself, opened through /proc/PID/cwd (no path
// another user controls is followed), so that kcr processes that know
// nothing of each other agree on it. Holding it, an empty parasiteProcDir
// is one a killed dump left behind, and would fail every dump there: it is
// removed. Release the lock with the returned function; without a lock
// (the directory cannot be opened or locked in time) it logs why and the
// dump goes on as before.
func lockDumpCwd(ctx context.Context, pid int, log *slog.Logger) (unlock func()) {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/cwd", pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		log.Debug("working directory of the process not locked for the dump", "pid", pid, "err", err)
		return func() {}
	}
	f := os.NewFile(uintptr(fd), "cwd")
	if err := flockWait(ctx, fd, cwdLockWait); err != nil {
		log.Warn("dumping without the lock on the process's working directory", "pid", pid, "err", err)
		f.Close()
		return func() {}
	}
	switch err := unix.Unlinkat(fd, parasiteProcDir, unix.AT_REMOVEDIR); {
	case err == nil:
		log.Info("removed the directory a killed dump left in the process's working directory", "pid", pid, "dir", parasiteProcDir)
	case errors.Is(err, unix.ENOENT):
	default:
		log.Warn("a directory CRIU needs is in the way in the process's working directory", "pid", pid, "dir", parasiteProcDir, "err", err)
	}
	return func() { f.Close() } // closing the last fd drops the flock
}

// flockWait takes an exclusive flock on fd, polling until ctx ends or wait
// has passed.
func flockWait(ctx context.Context, fd int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("flock: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("another dump held it for %v", wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
