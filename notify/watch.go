package notify

import (
	"context"
	"time"

	"github.com/kcr-dev/kcr/notify/proto"
)

// watch notices a restore that happened outside a checkpoint cycle: the app
// had resumed on its own (kcr died or was late) before CRIU froze it, so the
// image is of an idle app and no cycle is waiting to see the start time
// change. It polls the start time at a tenth of the cycle's rate; a cycle in
// progress is left to detect the restore itself, and the change is checked
// again when it ends.
func (s *Server) watch() {
	defer s.wg.Done()
	t := time.NewTicker(10 * s.cfg.pollEvery)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		st, changed := s.startChanged()
		if !changed {
			continue
		}
		cyc, err := s.g.begin()
		if err != nil {
			continue // a cycle runs; it ends as a Restore or we look again
		}
		s.restoredWhileIdle(cyc, st, Event{Kind: Restore, SelfDetected: true,
			Reason: "restored from an image of an idle app (it had resumed before the dump)"})
	}
}

// startChanged returns the process's instance key and whether it differs
// from the known one: the process is a restored copy.
func (s *Server) startChanged() (uint64, bool) {
	st, err := s.cfg.instance(s.hostPID())
	s.mu.Lock()
	defer s.mu.Unlock()
	return st, err == nil && st != s.knownStart
}

// restoredMessage handles kcr's after-restore message when no checkpoint
// waits for it: if this is a copy restored from an image of an idle app
// that the watch has not handled yet, it runs the cycle now, with kcr's
// generation, and returns the answer.
func (s *Server) restoredMessage(m proto.Message) (proto.Message, bool) {
	st, changed := s.startChanged()
	if !changed {
		return proto.Message{}, false
	}
	cyc, err := s.g.begin()
	if err != nil {
		return proto.Message{}, false
	}
	ev, after, aerr := s.restoredWhileIdle(cyc, st, Event{Kind: Restore, Generation: m.Generation, Name: m.Name,
		Reason: "restored from an image of an idle app (it had resumed before the dump)"})
	return s.done(ev, after, aerr), true
}

// restoredWhileIdle runs a whole cycle for a copy restored from an image of
// an idle app: the before hooks first (the dump cut their connections), then
// the restore hooks, as a new instance.
func (s *Server) restoredWhileIdle(cyc *cycle, st uint64, ev Event) (Event, []Report, error) {
	log := s.cfg.log
	log.Warn("kcr: restored from an image taken while the app was not suspended (it had resumed on its own); running a full cycle")
	s.setState("checkpointing")
	bctx, cancel := context.WithTimeout(context.Background(), DefaultHookBudget)
	_, berr := cyc.before(bctx)
	cancel()
	if berr != nil {
		log.Warn("kcr: before-checkpoint hooks failed on a copy restored while idle; restoring anyway", "err", berr)
	}
	s.setState("restoring")
	s.rebind(s.cfg.hostPID())
	actx, cancel := context.WithTimeout(context.Background(), s.cfg.afterBudget)
	ev, after, aerr := cyc.after(actx, ev)
	cancel()
	s.mu.Lock()
	s.knownStart = st
	s.mu.Unlock()
	cyc.end()
	s.setState("idle")
	s.logAfter(ev, aerr)
	return ev, after, aerr
}
