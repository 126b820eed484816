package standby

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/engine"
)

// Supervisor runs one service through the standby cycle. Create it with
// New (which checks everything and starts nothing), then call Run.
type Supervisor struct {
	o     Options
	log   *slog.Logger
	dir   *imageDir
	b     backend
	wakes []WakeSource // besides manual wakes
	// hold keeps the group from being empty while the service sleeps;
	// nil without Options.Group. With Options.NoHoldGroup it only sweeps
	// a placeholder an earlier kcr standby left.
	hold GroupKeeper
	// replica is the Kafka wake among replicas (Options.Replicas), also
	// in wakes; nil without.
	replica Replica
	listen  *listenSource // --listen, also in wakes; nil without
	ctl     *controlServer

	wakeCh  chan string  // wake sources while checkpointed; buffered, sends never block
	manual  chan request // manual wakes (kcr standby wake, SIGUSR1)
	sleepCh chan request // manual sleeps

	mu    sync.Mutex
	state State
	since time.Time // when state began (Health)
	cur   proc
	image string // the newest image's base name
	// cycle counts the times the service began to run (again): a request
	// is for the cycle it was made in.
	cycle uint64
	// ckptFails counts the failed checkpoints in a row (ckptBackoff).
	ckptFails int
	runStart  time.Time // when cur began to run

	// stateMu serializes the writes of the state file: the group hold
	// records its member id from its own goroutine.
	stateMu   sync.Mutex
	saved     persisted // the last state written, without the hold's
	holdSaved holdSaved
	// holdOnDisk is the hold's record in the state file as last written
	// successfully: setHoldSaved skips only a write that would repeat it.
	holdOnDisk holdSaved

	// ident is what the running copy was started as (identity.go); nil
	// if unknown (adopted without identity-running.json). Run's goroutine only.
	ident *identity

	lastWake wakeLog        // the last wake's phases (wakephases.go)
	bg       sync.WaitGroup // goroutines that outlive a state: close waits
}

// New checks the options and everything the supervisor needs before it
// starts anything: the command exists, the image directory is the caller's
// (and not in use), --listen is free, the broker answers. Every error is
// one line that names the problem and the fix.
func New(ctx context.Context, o Options) (*Supervisor, error) {
	return newSupervisor(ctx, o, nil)
}

// newSupervisor is New with the backend b (nil: the engine's).
func newSupervisor(ctx context.Context, o Options, b backend) (*Supervisor, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath(o.Args[0]); err != nil {
		return nil, fmt.Errorf("%w: command %q: %v: give its path, or a name found in $PATH", ErrBadOption, o.Args[0], err)
	}
	s := &Supervisor{o: o, log: o.Logger, wakeCh: make(chan string, 1), manual: make(chan request, 1), sleepCh: make(chan request, 1)}
	ok := false
	defer func() {
		if !ok {
			s.close()
		}
	}()
	var err error
	if s.dir, err = openImageDir(o.ImageDir); err != nil {
		return nil, err
	}
	if s.o.Log == "" {
		s.o.Log = s.dir.path + "/" + defaultServiceLogName
	}
	out, err := openOutput(&s.o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			out.close(0)
		}
	}()
	if o.Listen != "" {
		if s.listen, err = openListen(&s.o, s.dir.path, s.log); err != nil {
			return nil, err
		}
		s.wakes = append(s.wakes, s.listen)
	}
	if err := s.addKafkaWake(ctx); err != nil {
		return nil, err
	}
	criuPath := ""
	if b == nil {
		// A CRIU that cannot work would be found at the first checkpoint,
		// and then again at every idle period: find it now.
		if criuPath, _, err = engine.CRIU(ctx, o.CRIU); err != nil {
			return nil, err
		}
	}
	eb := &engineBackend{o: &s.o, log: s.log, dir: s.dir.path, exits: newExits(), out: out}
	if s.listen != nil {
		f, err := s.listen.file() // a dup, handed to every cold start
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w", o.Listen, err)
		}
		eb.extra = []*os.File{f}
		eb.fdsSocket = s.dir.path + "/" + controlSocketName
	}
	s.b = eb
	if b != nil {
		s.b = b
	} else {
		eb.cacheKdat(ctx, criuPath, s.dir.path)
	}
	if s.ctl, err = startControl(s.dir.path, s); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// addKafkaWake opens the Kafka wake (Options.KafkaWake), given --group
// or --share-group: its wake source, the replica and the group hold.
func (s *Supervisor) addKafkaWake(ctx context.Context) error {
	if s.o.Group == "" && s.o.ShareGroup == "" {
		return nil
	}
	if s.o.KafkaWake == nil {
		return fmt.Errorf("%w: --group and --share-group need the Kafka wake: set Options.KafkaWake (package kafkastandby)", ErrBadOption)
	}
	k, err := s.o.KafkaWake(ctx, &s.o, s.setHoldSaved)
	var bad interface{ BadOption() bool }
	if errors.As(err, &bad) && bad.BadOption() {
		return badOption{err}
	}
	if err != nil {
		return err
	}
	if k.Source != nil {
		s.wakes = append(s.wakes, k.Source)
	}
	s.hold, s.replica = k.Keeper, k.Replica
	return nil
}

// openOutput makes the pipes of the service's output with --log -, or
// checks that its log opens (now, not at the first cold start, which would
// retry it forever) and returns nil.
func openOutput(o *Options) (*serviceOutput, error) {
	if o.Log != LogStdio {
		lf, err := engine.OpenRunLog(o.Log)
		if err != nil {
			return nil, fmt.Errorf("%w: --log: %v", ErrBadOption, err)
		}
		return nil, lf.Close()
	}
	out, err := newServiceOutput(cmp.Or[io.Writer](o.ServiceStdout, os.Stdout), cmp.Or[io.Writer](o.ServiceStderr, os.Stderr))
	if err != nil {
		return nil, fmt.Errorf("the service's output pipes: %w", err)
	}
	return out, nil
}

func (s *Supervisor) close() {
	s.bg.Wait()
	if s.ctl != nil {
		s.ctl.close()
	}
	if s.hold != nil {
		s.hold.Close()
	}
	for _, w := range s.wakes {
		w.Close()
	}
	if s.b != nil {
		s.b.close()
	}
	if s.dir != nil {
		s.dir.close()
	}
}

// listenFiles are the --listen sockets handed to the service.
func (s *Supervisor) listenFiles() []*os.File { return s.b.listenFiles() }

// ControlSocket is the path of the supervisor's control socket (kcr
// standby wake|sleep|status).
func (s *Supervisor) ControlSocket() string { return s.dir.path + "/" + controlSocketName }

// Wake asks the supervisor to restore the service now; it reports whether
// the service is checkpointed or being checkpointed (a wake of a running
// service does nothing). A wake during a checkpoint abandons it: the
// service resumes and runs on (abandon.go).
func (s *Supervisor) Wake(source string) bool {
	s.mu.Lock()
	st, c := s.state, s.cycle
	s.mu.Unlock()
	if st != StateStandby && st != StateCheckpointing {
		return false
	}
	offer(s.manual, request{cycle: c, source: source})
	return true
}

// Sleep asks the supervisor to checkpoint the service now, as if it had
// been idle; it reports whether the service runs. The request is for this
// run of the service only: once it was checkpointed, it is spent.
func (s *Supervisor) Sleep() bool {
	s.mu.Lock()
	st, c := s.state, s.cycle
	s.mu.Unlock()
	if st != StateRunning {
		return false
	}
	offer(s.sleepCh, request{cycle: c})
	return true
}

// currentCycle is the service's current cycle.
func (s *Supervisor) currentCycle() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cycle
}

// State returns the current state.
func (s *Supervisor) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Status is what "kcr standby status" shows.
type Status struct {
	State State  `json:"state"`
	PID   int    `json:"pid,omitempty"`
	Image string `json:"image,omitempty"`
	// LastWake is the breakdown of the last wake (nil before one).
	LastWake *WakePhases `json:"last_wake,omitempty"`
	// Replica is why this replica is awake or asleep (Options.Replicas;
	// nil without).
	Replica *ReplicaStatus `json:"replica,omitempty"`
}

// Status returns the state, the service's PID and the newest image.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{State: s.state, Image: s.image, LastWake: s.lastWake.get()}
	if s.replica != nil {
		r := s.replica.Status()
		st.Replica = &r
	}
	if s.state == StateRunning || s.state == StateCheckpointing {
		st.PID = s.cur.PID
	}
	return st
}

func (s *Supervisor) setState(st State, attrs ...any) {
	s.mu.Lock()
	from := s.state
	s.state, s.since = st, time.Now()
	s.mu.Unlock()
	s.o.Observer.State(st)
	s.log.Info("standby: "+string(st), append([]any{"from", string(from), "to", string(st)}, attrs...)...)
}

// Run supervises the service until ctx ends. It then returns nil and
// leaves the service as it is: running, or checkpointed with its image
// kept; a new Supervisor on the same image directory goes on from there
// (see state.go).
func (s *Supervisor) Run(ctx context.Context) error {
	defer s.close()
	defer s.setState(StateStopped)
	s.b.adoptCopies()
	// Before the hold may start, and before the service may join.
	s.sweepHold()
	// What an earlier kcr standby set aside beyond Options.KeepBad, or
	// left half-removed.
	s.pruneBad()
	if err := s.dir.sweepRestoreWork(); err != nil {
		s.log.Warn("standby: removing the work directories of interrupted restores", "err", err)
	}
	r := s.resolve(ctx)
	s.dir.pruneIdentities()
	if r.next == StateStandby || r.next == StateRestoring {
		if why := s.imageOutdated("start"); why != "" {
			r.next, r.reason = StateStarting, why
		}
	}
	c := &run{next: r.next, p: r.p, reason: r.reason, src: "resume", at: time.Now()}
	switch r.next {
	case StateRunning:
		s.adoptIdentity()
		s.running(r.p, "adopted", true, "why", r.reason)
	case StateStandby, StateRestoring:
		s.log.Info("standby: resuming from an image", "image", s.image, "why", r.reason)
	}
	for ctx.Err() == nil && c.next != StateStopped {
		s.step(ctx, c)
	}
	s.shutdown(context.WithoutCancel(ctx))
	if s.hold != nil {
		s.hold.Stop()
	}
	st := s.State()
	s.log.Info("standby: stopping", "state", string(st), "pid", s.Status().PID, "image", s.Status().Image, "on_term", string(s.o.OnTerm))
	return c.err
}

// run is where Run is in the cycle.
type run struct {
	next    State
	p       proc
	crashes int
	reason  string    // of the next cold start
	src     string    // of the next restore
	at      time.Time // when that wake came
	err     error     // Run's (a crash loop)
}

// step does one step of the cycle: what c.next says.
func (s *Supervisor) step(ctx context.Context, c *run) {
	switch c.next {
	case StateStarting:
		s.coldStart(ctx, c)
	case StateBackoff:
		if s.crashLoop(c) {
			c.next = StateStopped
			return
		}
		d := backoff(s.o.BackoffMin, s.o.BackoffMax, c.crashes)
		s.setState(StateBackoff, "wait_ms", ms(d), "failures_in_a_row", c.crashes)
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		c.next = StateStarting
	case StateRunning:
		switch s.watch(ctx, c.p) {
		case outCrashed:
			s.serviceExited(c, "")
		case outIdle, outSleep:
			c.next = StateCheckpointing
		}
	case StateCheckpointing:
		s.checkpointWithIdentity(ctx, c)
		if c.next == StateStandby {
			c.crashes = 0
		} else if c.next == StateBackoff {
			c.crashes++
			c.reason = "the service died during its checkpoint"
		}
	case StateStandby:
		s.setState(StateStandby, "image", s.image)
		if err := s.writeState(persisted{State: StateStandby, Image: s.image, Wake: s.wakeStates()}); err != nil {
			s.log.Warn("standby: state file", "err", err)
		}
		s.prepareRestore(ctx)
		src, at, ok := s.waitWake(ctx)
		if !ok {
			return
		}
		if s.hold != nil {
			s.hold.Woken()
			s.bg.Go(func() { s.hold.ReleaseOthers(ctx) })
		}
		c.src, c.at, c.next = src, at, StateRestoring
	case StateRestoring:
		if why := s.imageOutdated("wake"); why != "" {
			c.reason, c.next = why, StateStarting
			return
		}
		p, err := s.restore(ctx, c.src, c.at)
		if errors.Is(err, errExitedInRestore) {
			c.p = p
			s.serviceExited(c, "during its after-restore hooks")
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				c.reason, c.next = "restore failed", StateStarting
			}
			return
		}
		c.p, c.next = p, StateRunning
	}
}

// coldStart starts the service cold, unless a copy of it runs already
// (an earlier kcr standby's, found by its marker): that one is adopted.
func (s *Supervisor) coldStart(ctx context.Context, c *run) {
	if p, ok := s.liveCopy(ctx); ok {
		s.adoptIdentity()
		s.running(p, "adopted", true, "why", "a copy of the service runs already")
		c.p, c.next = p, StateRunning
		return
	}
	s.setState(StateStarting, "reason", c.reason)
	if err := s.writeState(persisted{State: StateStarting}); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
	s.o.Observer.ColdStart(c.reason)
	s.noteColdStart()
	t := time.Now()
	np, err := s.b.start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		c.crashes++
		s.log.Error("standby: cold start failed", "err", err, "failures_in_a_row", c.crashes)
		c.reason, c.next = "cold start failed", StateBackoff
		return
	}
	c.p = np
	if s.replica != nil {
		s.replica.Started("", "started cold: "+c.reason)
	}
	s.running(np, "cold_start_ms", ms(time.Since(t)))
	c.next = StateRunning
}

// wakeStates are the wake sources' states, for the state file.
func (s *Supervisor) wakeStates() map[string]json.RawMessage {
	states := map[string]json.RawMessage{}
	for _, w := range s.wakes {
		st, err := w.SaveState()
		if err != nil {
			s.log.Warn("standby: state file: a wake source's state", "source", w.Name(), "err", err)
			continue
		}
		if st != nil {
			states[w.Name()] = st
		}
	}
	return states
}

// loadWakeStates gives the wake sources their states from the state file.
func (s *Supervisor) loadWakeStates(states map[string]json.RawMessage) {
	for _, w := range s.wakes {
		if st, ok := states[w.Name()]; ok {
			if err := w.LoadState(st); err != nil {
				s.log.Warn("standby: ignoring a wake source's state in the state file", "source", w.Name(), "err", err)
			}
		}
	}
}

// writeState writes the state file with p and the group hold's record.
func (s *Supervisor) writeState(p persisted) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	p.LastWake = s.lastWake.get()
	s.saved = p
	p.holdSaved = s.holdSaved
	if err := s.dir.writeState(p); err != nil {
		return err
	}
	s.holdOnDisk = p.holdSaved
	return nil
}

// setHoldSaved records the group hold's placeholder and protocol in the
// state file.
func (s *Supervisor) setHoldSaved(member, protocol string) error {
	h := holdSaved{HoldMember: member, HoldProtocol: protocol}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.holdSaved = h
	if s.holdOnDisk == h {
		return nil
	}
	p := s.saved
	p.holdSaved = h
	if err := s.dir.writeState(p); err != nil {
		s.log.Warn("standby: state file", "err", err)
		return err
	}
	s.holdOnDisk = h
	return nil
}

// sweepHold removes the placeholder a killed kcr standby left in the
// group: it would keep the group from being empty (so the new hold would
// wait) until its session times out.
func (s *Supervisor) sweepHold() {
	st, err := s.dir.readState()
	if err != nil {
		return
	}
	s.stateMu.Lock()
	s.saved, s.holdSaved, s.holdOnDisk = st, st.holdSaved, st.holdSaved
	s.saved.holdSaved = holdSaved{}
	s.stateMu.Unlock()
	if s.hold != nil {
		s.hold.Load(st.HoldMember, st.HoldProtocol)
	}
	if st.HoldMember == "" {
		return
	}
	if s.hold == nil {
		s.log.Warn("standby: an earlier kcr standby left a placeholder in its group; without --group it stays until its session times out", "member_id", st.HoldMember)
		return
	}
	if err := s.hold.Sweep(st.HoldMember); err != nil {
		s.log.Warn("standby: removing the placeholder an earlier kcr standby left in the group failed; trying again until its session ends", "group", s.o.Group, "member_id", st.HoldMember, "err", err)
		go s.hold.LeaveLater(st.HoldMember)
		return
	}
	s.log.Info("standby: removed the placeholder an earlier kcr standby left in the group", "group", s.o.Group, "member_id", st.HoldMember)
}

func (s *Supervisor) setImage(name string) {
	s.mu.Lock()
	s.image = name
	s.mu.Unlock()
}

// running records that p runs now: a new cycle.
func (s *Supervisor) running(p proc, attrs ...any) {
	s.mu.Lock()
	if s.cur != p {
		s.runStart = time.Now()
	}
	s.cur = p
	s.cycle++
	s.mu.Unlock()
	if err := s.writeState(persisted{State: StateRunning, PID: p.PID, Start: p.Start}); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
	s.setState(StateRunning, append([]any{"pid", p.PID}, attrs...)...)
}

type outcome int

const (
	outStopped outcome = iota
	outIdle
	outSleep
	outCrashed
)

// watch polls the service's activity until it has been idle for
// Options.Idle, a sleep is asked for, it exits, or ctx ends.
func (s *Supervisor) watch(ctx context.Context, p proc) outcome {
	tick := time.NewTicker(s.o.ActivityPoll)
	defer tick.Stop()
	lastActive := time.Now()
	var count uint64
	seen, warned := false, false
	cycle := s.currentCycle()
	s.mu.Lock()
	idleFor := ckptBackoff(&s.o, s.ckptFails)
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return outStopped
		case r := <-s.sleepCh:
			if r.cycle != cycle {
				s.log.Info("standby: ignoring a sleep asked for in an earlier cycle", "pid", p.PID)
				continue
			}
			s.log.Info("standby: sleep asked for", "pid", p.PID)
			return outSleep
		case <-s.manual: // already awake
		case <-tick.C:
			if !s.b.alive(p) {
				return outCrashed
			}
			a, err := s.b.activity(ctx, p)
			if err != nil {
				if !s.b.alive(p) {
					return outCrashed
				}
				// Unseen is not idle.
				lastActive = time.Now()
				if !warned {
					s.log.Warn("standby: cannot read the service's activity; it is kept running", "pid", p.PID, "err", err)
					warned = true
				}
				continue
			}
			warned = false
			if !seen || a.Count != count || a.OpenConns > 0 || a.HooksInFlight {
				lastActive = time.Now()
			}
			seen, count = true, a.Count
			if idle := time.Since(lastActive); idle >= idleFor {
				s.log.Info("standby: the service is idle", "pid", p.PID, "idle_ms", ms(idle), "activity", a.Count)
				return outIdle
			}
		}
	}
}

// checkpoint checkpoints p into a new image, which then replaces the old
// one. It returns the next state: StateStandby, StateRunning (the hooks
// refused, or the dump failed: the service resumed) or StateBackoff (the
// service is gone without an image). atTerm is the shutdown's checkpoint
// (shutdown.go): records waiting do not hold it back.
func (s *Supervisor) checkpoint(ctx context.Context, p proc, atTerm bool) State {
	name, err := s.dir.nextImage()
	if err != nil {
		s.log.Error("standby: cannot name the next image; the service runs on", "err", err)
		return StateRunning
	}
	// Idle is not enough: work the service has not taken yet (it is still
	// joining its group, say) keeps it awake.
	busy := s.wakes
	if atTerm {
		busy = nil
	}
	for _, w := range busy {
		why, err := w.Busy(ctx)
		switch {
		case err != nil:
			s.log.Warn("standby: pending work unknown before the checkpoint; going on (the wait wakes the service on any work)", "source", w.Name(), "err", err)
		case why != "":
			s.log.Info("standby: not checkpointing: work is waiting", "source", w.Name(), "why", why, "pid", p.PID)
			return StateRunning
		}
	}
	// No kcr connection to the service may be open at the dump.
	s.stopFirstActivity()
	s.noteSleepActivity(ctx, p)
	s.setState(StateCheckpointing, "pid", p.PID, "image", name)
	if err := s.writeState(persisted{State: StateCheckpointing, PID: p.PID, Start: p.Start, Image: name, Wake: s.wakeStates()}); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
	t := time.Now()
	err = s.dump(ctx, p, name, atTerm, t)
	d := time.Since(t)
	if errors.Is(err, errAbandoned) {
		return StateRunning
	}
	if err != nil {
		if s.hold != nil {
			s.hold.Stop()
		}
		s.o.Observer.Checkpoint(d, 0, err)
		if !s.b.alive(p) {
			s.log.Error("standby: checkpoint failed and the service is gone", "pid", p.PID, "err", err)
			return StateBackoff
		}
		s.mu.Lock()
		if costly(err) {
			s.ckptFails++
		}
		next := ckptBackoff(&s.o, s.ckptFails)
		s.mu.Unlock()
		s.log.Warn("standby: checkpoint refused or failed; the service resumed and runs on", "pid", p.PID, "err", err,
			"duration_ms", ms(d), "next_after_idle_ms", ms(next))
		s.running(p, "after", "failed checkpoint")
		return StateRunning
	}
	if s.hold != nil {
		s.hold.Asleep(ctx)
	}
	s.mu.Lock()
	s.ckptFails = 0
	s.mu.Unlock()
	size := s.dir.size(name)
	s.o.Observer.Checkpoint(d, size, nil)
	// The new image is complete: it is the one to restore from now on,
	// and the older ones go.
	s.mu.Lock()
	old := s.image
	s.image = name
	s.cur = proc{}
	s.mu.Unlock()
	if err := s.writeState(persisted{State: StateStandby, Image: name, Wake: s.wakeStates()}); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
	if err := s.dir.removeOlder(name); err != nil {
		s.log.Warn("standby: removing older images", "err", err)
	}
	s.log.Info("standby: checkpointed", "pid", p.PID, "image", name, "replaced", old, "duration_ms", ms(d), "image_bytes", size)
	return StateStandby
}

// waitWake waits, the service checkpointed, for a wake: a manual one, or
// one of the wake sources' (lag on the broker, a connection on the
// listening socket). ok is false if ctx ended first.
func (s *Supervisor) waitWake(ctx context.Context) (source string, at time.Time, ok bool) {
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	// A source's wake left from an earlier sleep is spent (the one that
	// woke the service then, or one that came with it).
	select {
	case <-s.wakeCh:
	default:
	}
	for _, w := range s.wakes {
		wg.Go(func() {
			if w.Wait(wctx) == nil {
				select {
				case s.wakeCh <- w.Name():
				default:
				}
			}
		})
	}
	cycle := s.currentCycle()
	for {
		select {
		case <-ctx.Done():
			return "", time.Time{}, false
		case src := <-s.wakeCh:
			return src, time.Now(), true
		case r := <-s.manual:
			// Asked for during this sleep or the checkpoint before it.
			if r.cycle == cycle {
				return r.source, time.Now(), true
			}
		}
	}
}

// restore restores the newest image. A failed restore sets the image
// aside and returns the error: the caller starts the service cold.
func (s *Supervisor) restore(ctx context.Context, source string, wokeAt time.Time) (proc, error) {
	s.setState(StateRestoring, "source", source, "image", s.image)
	if err := s.writeState(persisted{State: StateRestoring, Image: s.image, Wake: s.wakeStates()}); err != nil {
		s.log.Warn("standby: state file", "err", err)
	}
	t := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.stuckAfter())
	p, err := s.b.restore(rctx, s.dir.path, s.image)
	cancel()
	d := time.Since(t)
	s.o.Observer.Restore(d, err)
	if errors.Is(err, errExitedInRestore) {
		s.mu.Lock()
		s.runStart = t
		s.mu.Unlock()
		return p, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return proc{}, err
		}
		if diskFull(err) {
			// Not the image's fault: it stays the one to restore.
			s.log.Error("standby: restore failed on a full disk; starting the service cold, the image is kept", "image", s.image, "err", err)
			return proc{}, err
		}
		aside, aerr := s.dir.setAside(s.image)
		log := ""
		if aerr == nil {
			log = s.dir.keepRestoreLog(s.image, aside)
		}
		s.log.Error("standby: restore failed; starting the service cold", "image", s.image, "kept_as", aside, "restore_log", log, "err", err, "aside_err", aerr)
		s.pruneBad()
		next := ""
		if imgs, _ := s.dir.imagesNewestFirst(); len(imgs) > 0 {
			next = imgs[0]
		}
		s.setImage(next)
		return proc{}, err
	}
	latency := time.Since(wokeAt)
	s.o.Observer.Wake(source, latency)
	if s.replica != nil {
		s.replica.Started(source, "woken by "+source)
	}
	w := s.noteWake(source, wokeAt, t.Add(d))
	s.running(p, "source", source, "image", s.image, "wake_latency_ms", ms(latency), "restore_ms", ms(d))
	s.startFirstActivity(ctx, p, w, wokeAt)
	return p, nil
}

// pruneBad removes the images set aside beyond Options.KeepBad.
func (s *Supervisor) pruneBad() {
	removed, err := s.dir.pruneBad(s.o.KeepBad)
	if len(removed) > 0 {
		s.log.Info("standby: removed older images set aside", "images", removed, "keep", max(s.o.KeepBad, 0))
	}
	if err != nil {
		s.log.Warn("standby: removing older images set aside", "err", err)
	}
}

// backoff is the wait before the n-th restart in a row: min doubled n-1
// times, at most max.
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
