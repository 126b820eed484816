package standby

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A wake during a checkpoint does not wait for the dump: the checkpoint
// is abandoned (CRIU stops within a chunk of pages and resumes the
// service; its hooks are told it resumed) and the service, which never
// stopped being the running copy, takes the work.

// ckptWake watches for a wake while the service is being checkpointed.
type ckptWake struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	source string // the wake's source; "" if none came
	at     time.Time
}

// watchCheckpoint returns a context for the checkpoint of the cycle's
// copy that ends when a wake comes: a manual one for this cycle, or work
// on a wake source (records that came after the check before the
// checkpoint; not the replicas' claims). stop ends the watch.
func (s *Supervisor) watchCheckpoint(ctx context.Context, cycle uint64) (context.Context, *ckptWake) {
	cctx, cancel := context.WithCancel(ctx)
	w := &ckptWake{cancel: cancel}
	for _, src := range s.wakes {
		if !src.AbandonsCheckpoint() {
			continue
		}
		w.wg.Go(func() {
			if src.Wait(cctx) == nil {
				w.woke(src.Name())
			}
		})
	}
	w.wg.Go(func() {
		for {
			select {
			case <-cctx.Done():
				return
			case r := <-s.manual:
				// One of an earlier cycle is spent.
				if r.cycle == cycle {
					w.woke(r.source)
					return
				}
			}
		}
	})
	return cctx, w
}

// woke records the first wake and abandons the checkpoint.
func (w *ckptWake) woke(source string) {
	w.mu.Lock()
	if w.source == "" {
		w.source, w.at = source, time.Now()
	}
	w.mu.Unlock()
	w.cancel()
}

// stop ends the watch and returns the wake that came, if any.
func (w *ckptWake) stop() (source string, at time.Time) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.source, w.at
}

// errAbandoned is dump's error when a wake abandoned the checkpoint: the
// service runs on.
var errAbandoned = errors.New("checkpoint abandoned for a wake")

// dump arms the group hold and has the backend checkpoint p into name,
// begun at t, abandoned if a wake comes meanwhile (not at a shutdown's
// checkpoint, atTerm).
func (s *Supervisor) dump(ctx context.Context, p proc, name string, atTerm bool, t time.Time) error {
	if s.hold != nil {
		// In before the service's member leaves: the group is never empty.
		s.hold.Arm(ctx)
	}
	// --stuck-after is the checkpoint's deadline: CRIU is killed past it
	// and the service runs on (criu.KillGrace).
	dctx, cancel := context.WithTimeout(ctx, s.stuckAfter())
	defer cancel()
	if atTerm {
		return s.b.checkpoint(dctx, p, s.dir.path, name)
	}
	cctx, cw := s.watchCheckpoint(dctx, s.currentCycle())
	err := s.b.checkpoint(cctx, p, s.dir.path, name)
	if s.wokeInCheckpoint(ctx, cw, p, err, time.Since(t)) {
		return errAbandoned
	}
	return err
}

// wokeInCheckpoint ends the watch of a checkpoint that took d and ended
// with err. It reports whether a wake abandoned the checkpoint: the
// service runs on, its hooks resumed. A wake that came too late to
// abandon the dump is offered again, for the sleep that follows.
func (s *Supervisor) wokeInCheckpoint(ctx context.Context, cw *ckptWake, p proc, err error, d time.Duration) bool {
	src, at := cw.stop()
	switch {
	case src == "":
		return false
	case err == nil:
		offer(s.manual, request{cycle: s.currentCycle(), source: src})
		return false
	case ctx.Err() != nil || !s.b.alive(p):
		return false
	}
	if s.hold != nil {
		s.hold.Stop()
	}
	s.log.Info("standby: checkpoint abandoned for a wake; the service resumed", "pid", p.PID, "source", src,
		"checkpoint_ms", ms(d), "wake_to_resumed_ms", ms(time.Since(at)))
	s.running(p, "after", "abandoned checkpoint")
	return true
}
