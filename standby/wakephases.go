package standby

import (
	"context"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/engine"
)

// WakePhases is the breakdown of one wake, as far as the supervisor can
// see it: each time is in milliseconds from the wake signal (work
// detected). What comes after (the service's group joined, the first
// result written) happens inside the service and on the broker: a
// benchmark takes it from there (scripts/bench-standby.sh), and the time
// from a record's write to its detection from the record's timestamp.
type WakePhases struct {
	Source string `json:"source"`
	// At is the wake signal, wall clock.
	At time.Time `json:"at"`
	// RestoredMS: CRIU restored the service; it runs.
	RestoredMS float64 `json:"restored_ms"`
	// HooksDoneMS: its after-restore hooks are done (connections
	// reopened; consumer groups rejoin from here).
	HooksDoneMS float64 `json:"hooks_done_ms"`
	// FirstActivityMS: the service's first activity after the wake (a
	// record handed to it, a request answered: its activity count passed
	// the one it was checkpointed with), polled every firstActivityPoll
	// from HooksDoneMS on; 0 until seen, and if none came within
	// firstActivityWait.
	FirstActivityMS float64 `json:"first_activity_ms,omitempty"`
	// Prepared is set when the restore was prepared ahead (image
	// verified, CRIU started) while the service slept.
	Prepared bool `json:"prepared"`
	// Restore is the restore's own phases (engine.Timings), in ms.
	Restore map[string]float64 `json:"restore,omitempty"`
}

const (
	firstActivityPoll = 2 * time.Millisecond
	firstActivityWait = 30 * time.Second
)

// PhaseObserver is an Observer that is also told each wake's phases
// (Metrics is one).
type PhaseObserver interface {
	WakePhase(phase string, d time.Duration)
}

// wakeLog keeps the last wake's phases.
type wakeLog struct {
	mu   sync.Mutex
	last *WakePhases
	// base is the service's activity count when it was last checkpointed:
	// a restored service that counts more has done something.
	base    uint64
	hasBase bool
	// stopWatch ends the running watchFirstActivity and waits for it
	// (nil: none runs).
	stopWatch func()
}

// startFirstActivity runs watchFirstActivity in the background until it
// is done or stopFirstActivity ends it.
func (s *Supervisor) startFirstActivity(ctx context.Context, p proc, wake *WakePhases, wokeAt time.Time) {
	s.stopFirstActivity()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.lastWake.mu.Lock()
	s.lastWake.stopWatch = func() { cancel(); <-done }
	s.lastWake.mu.Unlock()
	s.bg.Go(func() {
		defer close(done)
		s.watchFirstActivity(ctx, p, wake, wokeAt)
	})
}

// stopFirstActivity ends the first-activity watch, if one runs, and
// waits until its connection to the service's control socket is closed:
// CRIU refuses to dump a service with a socket connected to a process
// outside its tree (kcr), so none may be open at a checkpoint.
func (s *Supervisor) stopFirstActivity() {
	s.lastWake.mu.Lock()
	stop := s.lastWake.stopWatch
	s.lastWake.stopWatch = nil
	s.lastWake.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// noteSleepActivity records the service's activity count as it goes to
// sleep, for watchFirstActivity.
func (s *Supervisor) noteSleepActivity(ctx context.Context, p proc) {
	a, err := s.b.activity(ctx, p)
	s.lastWake.mu.Lock()
	s.lastWake.base, s.lastWake.hasBase = a.Count, err == nil
	s.lastWake.mu.Unlock()
}

func (w *wakeLog) get() *WakePhases {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return nil
	}
	c := *w.last
	return &c
}

func (w *wakeLog) set(p *WakePhases) {
	w.mu.Lock()
	w.last = p
	w.mu.Unlock()
}

// noteWake records a wake whose restore began at began and returned (its
// hooks done) at done.
func (s *Supervisor) noteWake(source string, wokeAt, done time.Time) *WakePhases {
	p := &WakePhases{Source: source, At: wokeAt.Round(0), HooksDoneMS: ms(done.Sub(wokeAt))}
	p.RestoredMS = p.HooksDoneMS
	if t, prepared, known := s.b.lastRestore(); known {
		p.RestoredMS -= ms(t.Get(engine.PhaseAfterHooks))
		p.Prepared = prepared
		p.Restore = map[string]float64{}
		for _, ph := range t {
			p.Restore[ph.Name] = ms(ph.Duration())
		}
	}
	s.lastWake.set(p)
	s.observePhase("restored", p.RestoredMS)
	s.observePhase("hooks_done", p.HooksDoneMS)
	return p
}

func (s *Supervisor) observePhase(phase string, msec float64) {
	if po, ok := s.o.Observer.(PhaseObserver); ok {
		po.WakePhase(phase, time.Duration(msec*float64(time.Millisecond)))
	}
}

// watchFirstActivity polls the restored service's activity until it
// changes, and records when: the first record handed to it, for a
// consumer.
func (s *Supervisor) watchFirstActivity(ctx context.Context, p proc, wake *WakePhases, wokeAt time.Time) {
	ctx, cancel := context.WithTimeout(ctx, firstActivityWait)
	defer cancel()
	s.lastWake.mu.Lock()
	base, ok := s.lastWake.base, s.lastWake.hasBase
	s.lastWake.mu.Unlock()
	if !ok {
		// Not seen asleep (an earlier kcr standby checkpointed it): from
		// now on.
		a, err := s.b.activity(ctx, p)
		if err != nil {
			return
		}
		base = a.Count
	}
	tick := time.NewTicker(firstActivityPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a, err := s.b.activity(ctx, p)
		if err != nil {
			return
		}
		if a.Count != base {
			d := ms(time.Since(wokeAt))
			s.lastWake.mu.Lock()
			if s.lastWake.last != nil && s.lastWake.last.At.Equal(wake.At) {
				s.lastWake.last.FirstActivityMS = d
			}
			s.lastWake.mu.Unlock()
			s.observePhase("first_activity", d)
			s.rewriteState()
			return
		}
	}
}

// rewriteState writes the state file again, with the last wake's phases.
func (s *Supervisor) rewriteState() {
	s.stateMu.Lock()
	p := s.saved
	s.stateMu.Unlock()
	if err := s.writeState(p); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
}
