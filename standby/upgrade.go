package standby

import (
	"context"
	"os"
	"strings"
	"sync"
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
// the service cold. "" means restore it; its identity is then the
// restored copy's.
func (s *Supervisor) imageOutdated(when string) string {
	s.setIdent(nil)
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
	why := rec.changes(w)
	if why == "" {
		why = rec.exeChanged()
	}
	if why != "" {
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
	rec.ProcExe, rec.ProcExeSize, rec.ProcExeSHA256, rec.Kernel, rec.CPUFlags = "", 0, "", "", nil
	s.setIdent(&rec)
	return ""
}

// runningIdentityName is the record of the running copy's identity: a
// kcr standby that adopts the copy reads it.
const runningIdentityName = "running"

// setIdent makes id the identity of the copy that runs next, recorded for
// a kcr standby that would adopt it.
func (s *Supervisor) setIdent(id *identity) {
	s.ident = id
	if id == nil {
		os.Remove(identityFile(s.dir.path, runningIdentityName))
		return
	}
	if err := writeIdentity(s.dir.path, runningIdentityName, *id); err != nil {
		s.log.Warn("standby: the running copy's identity is not recorded; a kcr standby that adopts it will not know it", "err", err)
	}
}

// adoptIdentity takes the identity of an adopted copy from the record
// the kcr standby that started or restored it left.
func (s *Supervisor) adoptIdentity() {
	s.ident = nil
	id, ok, err := readIdentity(s.dir.path, runningIdentityName)
	if err != nil {
		s.log.Warn("standby: the adopted copy's identity record is unreadable; it is only checked for a replaced binary", "err", err)
	}
	if ok {
		s.ident = &id
	}
}

// noteColdStart records the identity of the copy a cold start is about to
// start (nil if it cannot be known: the copy is then never found
// outdated, and its images have no record).
func (s *Supervisor) noteColdStart() {
	w, err := wantedIdentity(&s.o, newSalt())
	if err != nil {
		s.log.Warn("standby: cannot tell what the cold start runs; its images get no identity record", "err", err)
		s.setIdent(nil)
		return
	}
	s.setIdent(&w)
}

// discardImage removes the image name, and the restore prepared for it.
func (s *Supervisor) discardImage(name string) {
	s.b.dropPrepared()
	s.dir.discard(name)
	s.dir.pruneIdentities()
	s.setImage("")
}

// serviceOutdated compares, before the checkpoint of p (before its hooks
// run), what p was started as with what a cold start would run now, and
// reads the executable p runs. why is "" if p may be checkpointed; rec is
// then the identity to record with its image (Exe "": none, p's identity
// is unknown: it was adopted).
func (s *Supervisor) serviceOutdated(p proc) (rec identity, why string) {
	exe, size, sum, replaced, err := s.b.exe(p)
	switch {
	case replaced:
		// CRIU would refuse it (a deleted binary is over its
		// ghost-file limit), after the hooks, at every idle.
		return identity{}, "the binary was replaced under the running service"
	case err != nil:
		s.log.Warn("standby: cannot read the service's executable; checkpointing it without an identity record", "pid", p.PID, "err", err)
		return identity{}, ""
	case s.ident != nil && exe != "":
		rec = *s.ident
		rec.ProcExe, rec.ProcExeSize, rec.ProcExeSHA256 = exe, size, sum
	}
	if s.ident == nil {
		return identity{}, ""
	}
	w, err := wantedIdentity(&s.o, s.ident.EnvSalt)
	if err != nil {
		s.log.Warn("standby: cannot tell what a cold start would run; checkpointing the service as it is", "pid", p.PID, "err", err)
		return rec, ""
	}
	return rec, s.ident.changes(w)
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
	c.next = s.checkpoint(ctx, c.p, false)
	s.dir.pruneIdentities()
}

// stopService stops p gracefully: SIGTERM, at most HookBudget to exit,
// then SIGKILL.
func (s *Supervisor) stopService(p proc) {
	ctx, cancel := context.WithTimeout(context.Background(), s.o.HookBudget)
	defer cancel()
	s.b.stop(ctx, p)
}
