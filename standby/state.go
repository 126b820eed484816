package standby

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/internal/procfs"
)

// The supervisor's state machine, as written to the state file before each
// step that creates or destroys a process or an image, so that a kcr
// standby killed at any moment leaves enough for the next one to go on
// without a second copy of the service:
//
//	state          written                           with          a new kcr standby finding it
//	starting       before a cold start               -             adopts the copy it finds, else starts cold
//	running        once a copy runs                  PID, start    adopts it, else starts cold (newer image: restores it)
//	checkpointing  before the hooks and the dump     PID, image    adopts the copy if alive (and drops the image);
//	                                                                 else restores the image if complete, else starts cold
//	standby        once the image is published       image         waits for a wake (adopts a copy it finds)
//	restoring      before CRIU restores               image         adopts the copy it finds, else restores again
//
// "The copy it finds" is any process whose environment carries the marker
// markerEnv=IMAGE_DIR and that is init of its own PID namespace: every cold
// start gets the marker, and every restored copy keeps the environment of
// the process it was dumped from, so a copy is found even when it was
// created after the last write. More than one is never left running.

// markerEnv marks every copy of the service with its image directory.
const markerEnv = "KCR_STANDBY_DIR"

// resolved is where Run goes on from what an earlier kcr standby left.
type resolved struct {
	next   State // StateStarting, StateRunning, StateStandby or StateRestoring
	p      proc  // StateRunning: the adopted copy
	reason string
}

// resolve reads the state file and the image directory, finds the copies
// of the service still alive, and decides where Run begins.
func (s *Supervisor) resolve(ctx context.Context) resolved {
	st, err := s.dir.readState()
	if err != nil {
		s.log.Warn("standby: ignoring the state file", "err", err)
	}
	if done, err := s.dir.recoverPending(ctx); err != nil {
		s.log.Warn("standby: an interrupted checkpoint could not be finished", "err", err)
	} else if len(done) > 0 {
		s.log.Info("standby: finished the image of an interrupted checkpoint", "images", done)
	}
	imgs, err := s.dir.imagesNewestFirst()
	if err != nil {
		s.log.Warn("standby: listing images", "err", err)
	}
	if st.Wake != nil {
		s.loadWakeStates(st.Wake)
	}
	if p, ok := s.adoptable(ctx, st); ok {
		if st.State == StateCheckpointing && st.Image != "" {
			// The dump did not take the copy: its image (if any) is
			// of a process that runs on, and must never be restored.
			s.dir.discard(st.Image)
			imgs, _ = s.dir.imagesNewestFirst()
		}
		if len(imgs) > 0 {
			s.setImage(imgs[0])
		}
		return resolved{next: StateRunning, p: p, reason: "adopted (" + string(st.State) + ")"}
	}
	has := func(name string) bool { return name != "" && slices.Contains(imgs, name) }
	switch {
	case st.State == StateCheckpointing && has(st.Image):
		s.setImage(st.Image)
		return resolved{next: StateStandby, reason: "the interrupted checkpoint's image is complete"}
	case st.State == StateRestoring && has(st.Image):
		s.setImage(st.Image)
		return resolved{next: StateRestoring, reason: "the interrupted restore is done again"}
	case st.State == StateStandby && has(st.Image):
		s.setImage(st.Image)
		return resolved{next: StateStandby, reason: "the image an earlier kcr standby kept"}
	case (st.State == "" || st.State == StateStandby) && len(imgs) > 0:
		s.setImage(imgs[0])
		return resolved{next: StateStandby, reason: "the newest image an earlier kcr standby kept"}
	case st.State != "":
		if len(imgs) > 0 {
			s.setImage(imgs[0])
		}
		return resolved{next: StateStarting, reason: "the service an earlier kcr standby ran is gone (" + string(st.State) + ")"}
	}
	return resolved{next: StateStarting, reason: "first start"}
}

// adoptable finds the live copies of the service (the state file's PID,
// and every process with the marker). One is kept, after its control
// socket is found; the others are killed.
func (s *Supervisor) adoptable(ctx context.Context, st persisted) (proc, bool) {
	copies := s.b.copies()
	if p := (proc{PID: st.PID, Start: st.Start}); p.PID > 0 && s.b.alive(p) && !containsProc(copies, p) {
		copies = append(copies, p)
	}
	if len(copies) == 0 {
		return proc{}, false
	}
	keep := copies[0]
	for _, c := range copies[1:] {
		if c.PID == st.PID || (keep.PID != st.PID && c.Start < keep.Start) {
			keep = c
		}
	}
	for _, c := range copies {
		if c.PID != keep.PID {
			s.log.Error("standby: killing a second copy of the service", "pid", c.PID, "kept", keep.PID)
			s.b.killCopy(c)
		}
	}
	if err := s.b.ready(ctx, keep); err != nil {
		s.log.Error("standby: the copy an earlier kcr standby left never became ready; killing it", "pid", keep.PID, "err", err)
		s.b.killCopy(keep)
		return proc{}, false
	}
	return keep, true
}

// liveCopy returns a copy of the service that runs although Run has none:
// checked before every cold start, so that none is ever a second copy.
func (s *Supervisor) liveCopy(ctx context.Context) (proc, bool) {
	if len(s.b.copies()) == 0 {
		return proc{}, false
	}
	return s.adoptable(ctx, persisted{})
}

func containsProc(ps []proc, p proc) bool {
	for _, q := range ps {
		if q.PID == p.PID {
			return true
		}
	}
	return false
}

// findCopies lists the processes that are init of their own PID namespace
// and carry markerEnv=dir in their environment.
//
// Only a process of uid, every one of its uids, counts: the marker is an
// environment variable, which any user can give a process of its own in a
// PID namespace of its own, and kcr standby would then adopt it as its
// service (and hand it the --listen socket).
func findCopies(dir string, uid uint32) []proc {
	var out []proc
	for _, m := range procfs.NamespaceInitsWith(markerEnv + "=" + dir) {
		if m.UIDs != [4]uint32{uid, uid, uid, uid} {
			continue
		}
		out = append(out, proc{PID: m.PID, Start: m.Start})
	}
	return out
}

// request is a wake or sleep asked for in a cycle: a service's cycle
// begins each time it runs (again). A request is for the cycle it was
// made in only.
type request struct {
	cycle  uint64
	source string
}

// offer puts r on ch, replacing an older request waiting there: the
// newest request is the one that counts.
func offer(ch chan request, r request) {
	for {
		select {
		case ch <- r:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// ckptBackoff is how long the service must be idle before the next
// checkpoint after fails failed ones in a row: Idle doubled fails times,
// at most max(Idle, CheckpointBackoffMax).
func ckptBackoff(o *Options, fails int) time.Duration {
	return backoff(o.Idle, max(o.Idle, o.CheckpointBackoffMax), fails+1)
}

// costly reports a failed checkpoint that froze the service for nothing,
// or will fail again until someone acts: CRIU's dump failed, or the disk
// is full. Those back off; a refusal by the hooks (records in flight, a
// restore still finishing) is tried again after the next --idle.
func costly(err error) bool {
	var ce *criu.Error
	return errors.As(err, &ce) || diskFull(err)
}

// diskFull reports an error of a full disk or quota: kcr's own, or CRIU's
// (which says so in its log).
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, criu.CauseDiskFull)
}

// waitGone polls until p is gone, for at most d.
func waitGone(alive func() bool, d time.Duration) error {
	deadline := time.Now().Add(d)
	for alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("still alive after %v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
