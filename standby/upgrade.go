package standby

import (
	"context"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// What kcr standby does with a service whose identity changed
// (identity.go): an image is removed before its restore, a running
// service is stopped and started again at its next idle, in place of its
// checkpoint. Either way the service starts cold on what a start runs
// now, with one line saying why; nothing is counted as a failure.

var hereCPUFlags = sync.OnceValue(cpuFlags)

// imageOutdated checks the image to restore against what a cold start
// would run now, and against this machine's CPU. An image that must not
// be restored is removed (not set aside: it is sound, only outdated, and
// as big as the service's memory) and why is returned: the caller starts
// the service cold. "" means restore it.
func (s *Supervisor) imageOutdated(when string) string {
	name := s.image
	if name == "" {
		return ""
	}
	rec, ok, err := readIdentity(s.dir.path, name)
	if err != nil {
		s.log.Warn("standby: the image's identity record is unreadable; restoring the image without comparing it", "image", name, "err", err)
		return ""
	}
	if !ok {
		return "" // an older kcr's image
	}
	w, err := wantedIdentity(&s.o, rec.EnvSalt)
	if err != nil {
		s.log.Warn("standby: cannot tell what a cold start would run; restoring the image without comparing it", "image", name, "err", err)
		return ""
	}
	if why := rec.changes(w); why != "" {
		s.discardImage(name)
		s.log.Info("standby: not restoring the image, "+why+"; starting the service cold", "image", name, "at", when)
		return why
	}
	if miss := missingCPUFlags(rec.CPUFlags, hereCPUFlags()); len(miss) > 0 {
		why := "this CPU lacks features of the CPU the image was dumped on (" + strings.Join(miss, " ") + ")"
		s.discardImage(name)
		s.log.Warn("standby: not restoring the image, "+why+"; starting the service cold", "image", name, "at", when,
			"image_kernel", rec.Kernel, "kernel", kernelRelease())
		return why
	}
	return ""
}

// discardImage removes the image name, and the restore prepared for it.
func (s *Supervisor) discardImage(name string) {
	if eb, ok := s.b.(*engineBackend); ok {
		eb.dropPrepared()
	}
	s.dir.discard(name)
	s.dir.pruneIdentities()
	s.setImage("")
}

// serviceOutdated reads the running service's identity before its
// checkpoint (before its hooks run) and compares it with what a cold
// start would run now. why is "" if they agree; id is the identity to
// record with the image.
func (s *Supervisor) serviceOutdated(p proc) (id identity, why string) {
	if _, ok := s.b.(*engineBackend); !ok {
		return identity{}, "" // a test's fake service has no /proc entry
	}
	id, replaced, err := procIdentity(p.PID, &s.o)
	if err != nil {
		s.log.Warn("standby: cannot read the service's identity; checkpointing it without a record", "pid", p.PID, "err", err)
		return identity{}, ""
	}
	if replaced {
		// CRIU would refuse it (a deleted binary is over its ghost-file
		// limit), after the hooks, at every idle.
		return identity{}, "the binary was replaced under the running service"
	}
	w, err := wantedIdentity(&s.o, id.EnvSalt)
	if err != nil {
		s.log.Warn("standby: cannot tell what a cold start would run; checkpointing the service as it is", "pid", p.PID, "err", err)
		return id, ""
	}
	return id, id.changes(w)
}

// checkpointWithIdentity checkpoints p (Supervisor.checkpoint) with its
// identity recorded beside the image, or, if p is outdated, stops it
// gracefully and has it started cold (StateStarting).
func (s *Supervisor) checkpointWithIdentity(ctx context.Context, c *run) {
	id, why := s.serviceOutdated(c.p)
	if why != "" {
		s.log.Info("standby: "+why+"; stopping the service and starting it cold, in place of its checkpoint", "pid", c.p.PID)
		s.stopService(c.p)
		c.reason, c.next = why, StateStarting
		return
	}
	if id.Exe != "" {
		// Written before the image is published (under the lock,
		// nextImage is the name checkpoint takes), so that no image is
		// ever without its record; removed below if none came.
		id.Kernel, id.CPUFlags = kernelRelease(), hereCPUFlags()
		if name, err := s.dir.nextImage(); err == nil {
			if err := writeIdentity(s.dir.path, name, id); err != nil {
				s.log.Warn("standby: the image gets no identity record; it is restored without comparing it", "err", err)
			}
		}
	}
	c.next = s.checkpoint(ctx, c.p)
	s.dir.pruneIdentities()
}

// stopService stops p gracefully: SIGTERM, at most HookBudget to exit,
// then SIGKILL.
func (s *Supervisor) stopService(p proc) {
	if _, ok := s.b.(*engineBackend); ok && s.b.alive(p) {
		unix.Kill(p.PID, unix.SIGTERM)
		waitGone(func() bool { return s.b.alive(p) }, s.o.HookBudget)
	}
	if s.b.alive(p) {
		s.b.killCopy(p)
	}
}
