package standby

import (
	"context"
	"os"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/engine"
)

// What a long-lived supervisor does before a wake arrives, so that the
// wake pays for the restore only: CRIU's kernel probe is cached for its
// lifetime (criu.CacheKdat), and while the service sleeps its image is
// verified and opened and CRIU started (engine.PrepareRestore).

// cacheKdat caches CRIU's kernel probe for the supervisor's lifetime
// (Options.NoKdatCache turns it off); a failure costs the probe at every
// CRIU run, nothing more.
func (b *engineBackend) cacheKdat(ctx context.Context, criuPath, dir string) {
	if b.o.NoKdatCache {
		return
	}
	k, err := criu.CacheKdat(ctx, criuPath, dir)
	if err != nil {
		b.log.Warn("standby: CRIU's kernel probe is not cached; every checkpoint and restore probes again", "err", err)
		return
	}
	b.kdat = k
}

// prepare starts verifying and opening the image dir/name and starting
// CRIU for its restore (Options.NoPrepare turns it off), in the
// background: the wake must not wait for it to be detected. A failure is
// only logged: the restore then does it all.
func (b *engineBackend) prepare(ctx context.Context, dir, name string) {
	b.dropPrepared()
	if b.o.NoPrepare {
		return
	}
	done := make(chan *engine.PreparedRestore, 1)
	b.preparing, b.preparedImage = done, name
	go func() {
		pr, err := engine.PrepareRestore(ctx, b.restoreOptions(dir, name))
		if err != nil {
			b.log.Warn("standby: could not prepare the restore ahead; the wake does it", "image", name, "err", err)
		}
		done <- pr
	}()
}

// takePrepared returns the restore prepared for the image name, waiting for
// its preparation to end, or nil.
func (b *engineBackend) takePrepared(name string) *engine.PreparedRestore {
	if b.preparing == nil || b.preparedImage != name {
		b.dropPrepared()
		return nil
	}
	pr := <-b.preparing
	b.preparing, b.preparedImage = nil, ""
	return pr
}

// dropPrepared closes a prepared restore that will not be used.
func (b *engineBackend) dropPrepared() {
	if b.preparing != nil {
		(<-b.preparing).Close()
	}
	b.preparing, b.preparedImage = nil, ""
}

// close releases what the backend holds for the supervisor's lifetime.
func (b *engineBackend) close() {
	b.dropPrepared()
	b.kdat.Release()
	for _, f := range b.extra {
		f.Close()
	}
	// What the last copy wrote before it was checkpointed or stopped,
	// passed on before kcr standby exits.
	b.out.close(outputDrain)
}

func (b *engineBackend) restoreOptions(dir, name string) engine.RestoreOptions {
	o := engine.RestoreOptions{Image: dir + "/" + name, CRIU: b.o.CRIU, Logger: b.log}
	o.Stdout, o.Stderr = b.stdio()
	if !b.lazyFor(dir, name) {
		// CRIU's log, kept after a failed restore with the image set
		// aside; not in /tmp, where each would stay for good.
		o.WorkDir = restoreWorkDir(dir, name)
		os.RemoveAll(o.WorkDir) // a killed kcr standby's
		if err := os.Mkdir(o.WorkDir, 0o700); err != nil {
			b.log.Warn("standby: restore work directory", "err", err)
			o.WorkDir = ""
		}
	} else {
		// Kept until the daemon is done (waitLazy); in the image
		// directory, which is the caller's alone.
		o.Lazy, o.WorkDir = true, lazyWorkDir(dir, name)
		if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
			b.log.Warn("standby: lazy restore work directory", "err", err)
		}
	}
	return o
}

// prepareRestore prepares the restore of the current image, if the backend
// can.
func (s *Supervisor) prepareRestore(ctx context.Context) {
	s.b.prepare(ctx, s.dir.path, s.image)
}
