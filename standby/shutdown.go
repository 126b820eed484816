package standby

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// TermPolicy is what kcr standby does with a running service when it is
// told to stop (SIGTERM: systemctl stop, a pod's deletion, a node drain).
type TermPolicy string

// The shutdown policies (docs/standby.md, "Shutdown").
const (
	// TermCheckpoint runs the hooks and checkpoints the service, even with
	// records waiting; its image is kept, and the next kcr standby on the
	// same image directory restores it warm. A checkpoint refused, failed
	// or not done within its share of the grace period falls back to
	// TermStop.
	TermCheckpoint TermPolicy = "checkpoint"
	// TermStop sends the service SIGTERM (its own shutdown closes its
	// clients: commits and leaves its group), and SIGKILL if it is still
	// there when the grace period ends. The next start is cold.
	TermStop TermPolicy = "stop"
	// TermLeave leaves the service as it is: running without a
	// supervisor (on a host), or killed with the container (in a pod).
	TermLeave TermPolicy = "leave"
)

// Defaults of the shutdown.
const (
	DefaultOnTerm = TermCheckpoint
	// DefaultTermGrace fits in Kubernetes' default
	// terminationGracePeriodSeconds (30 s) and systemd's TimeoutStopSec.
	DefaultTermGrace = 25 * time.Second
	// maxStopShare is the most of the grace period kept for the stop that
	// follows a failed checkpoint.
	maxStopShare = 10 * time.Second
)

func (p TermPolicy) check() error {
	switch p {
	case TermCheckpoint, TermStop, TermLeave:
		return nil
	}
	return fmt.Errorf("--on-term %q: give checkpoint, stop or leave", string(p))
}

// stopShare is the part of grace kept for stopping the service after a
// checkpoint that failed: a third, at most maxStopShare.
func stopShare(grace time.Duration) time.Duration {
	return min(grace/3, maxStopShare)
}

// shutdown applies Options.OnTerm to the service, if one runs, within
// Options.TermGrace. It is called once Run's context ended; parent must
// not be that context.
func (s *Supervisor) shutdown(parent context.Context) {
	p, ok := s.runningCopy()
	if !ok || s.o.OnTerm == TermLeave {
		return
	}
	ctx, cancel := context.WithTimeout(parent, s.o.TermGrace)
	defer cancel()
	t := time.Now()
	if s.o.OnTerm == TermCheckpoint {
		cctx, ccancel := context.WithTimeout(ctx, s.o.TermGrace-stopShare(s.o.TermGrace))
		next := s.checkpoint(cctx, p, true)
		ccancel()
		if next == StateStandby {
			s.setState(StateStandby, "image", s.Status().Image)
			s.log.Info("standby: shutdown: the service is checkpointed; the next start restores it", "policy", string(s.o.OnTerm), "image", s.Status().Image, "shutdown_ms", ms(time.Since(t)))
			return
		}
		if !s.b.alive(p) {
			s.log.Warn("standby: shutdown: the checkpoint failed and the service is gone", "pid", p.PID)
			return
		}
		s.log.Warn("standby: shutdown: the checkpoint failed or took too long; stopping the service instead", "pid", p.PID, "after_ms", ms(time.Since(t)))
	}
	killed := s.b.stop(ctx, p)
	s.mu.Lock()
	s.cur = proc{}
	s.mu.Unlock()
	// The next start is cold: no copy runs, and the state says so.
	if err := s.writeState(persisted{State: StateStarting}); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
	s.log.Info("standby: shutdown: the service is stopped", "pid", p.PID, "policy", string(s.o.OnTerm), "killed", killed, "shutdown_ms", ms(time.Since(t)))
}

// runningCopy is the copy of the service that runs now, if any: the one
// Run knows, or one a restore that the shutdown interrupted left.
func (s *Supervisor) runningCopy() (proc, bool) {
	s.mu.Lock()
	p := s.cur
	s.mu.Unlock()
	if p.PID > 0 && s.b.alive(p) {
		return p, true
	}
	for _, c := range s.b.copies() {
		if s.b.alive(c) {
			return c, true
		}
	}
	return proc{}, false
}

// stop sends p SIGTERM, waits until it is gone or ctx ends, and then kills
// it. It reports whether it had to kill it.
func (b *engineBackend) stop(ctx context.Context, p proc) (killed bool) {
	if alive(p) {
		// The service is init of its PID namespace: it gets the signal
		// only because it handles it (every Go program does).
		syscall.Kill(p.PID, syscall.SIGTERM)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for alive(p) {
		select {
		case <-ctx.Done():
			b.killCopy(p)
			return true
		case <-tick.C:
		}
	}
	return false
}
