package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	"github.com/kcr-dev/kcr/notify/proto"
)

// This file is the server side of a checkpoint cycle: the state machine from
// the request through the wait for kcr's follow-up to the after-restore
// hooks.

// errKCRGone cancels the before-checkpoint hooks when kcr hangs up.
var errKCRGone = errors.New("kcr went away during the before-checkpoint hooks")

func (s *Server) setState(st string) {
	s.mu.Lock()
	s.state = st
	s.mu.Unlock()
	s.cfg.log.Debug("kcr control socket: state", "state", st)
}

// checkpoint runs one cycle: before hooks, "ready", then the wait for the
// CLI's follow-up, and the after hooks. It returns when the cycle is over.
//
// kcr is watched throughout: while the hooks run through the connection
// (its hangup cancels the hooks), afterwards through its PID, so that the app
// resumes at once when kcr dies instead of waiting for resumeAfter.
func (s *Server) checkpoint(c *net.UnixConn, m proto.Message, kcr peer) {
	asked := time.Now()
	cyc, err := s.g.begin()
	if err != nil {
		s.reply(c, proto.Message{Type: proto.TypeBusy, Error: ErrBusy.Error()})
		c.Close()
		return
	}
	budget, resumeAfter := s.limits(m)
	st0, _ := s.cfg.instance(s.pid)
	s.setState("checkpointing")
	reports, berr := s.runBefore(cyc, c, m, budget)
	switch {
	case berr != nil:
		s.refuse(c, cyc, reports, berr, asked.Add(requestBudget(m)+4*time.Second))
	case s.quitting():
		s.abortClosed(c, cyc)
	default:
		s.freeHeap()
		ev, f := s.ready(c, st0, resumeAfter, kcr, reports)
		s.finish(cyc, ev, f)
	}
}

// freeHeap returns the heap's free pages to the kernel before the dump
// (WithFreeHeapBeforeDump), the hooks done: they are then neither dumped
// nor restored.
func (s *Server) freeHeap() {
	if s.cfg.keepHeap {
		return
	}
	start := time.Now()
	debug.FreeOSMemory()
	s.cfg.log.Debug("kcr: returned the free heap to the kernel before the dump", "took", time.Since(start))
}

// limits are the hook budget and the wait for kcr's follow-up that m asks
// for, or the defaults, within the app's caps.
func (s *Server) limits(m proto.Message) (budget, resumeAfter time.Duration) {
	budget = m.HookBudget
	if budget <= 0 {
		budget = DefaultHookBudget
	}
	if budget > s.cfg.maxBudget {
		s.cfg.log.Warn("kcr: hook budget asked for is above the app's cap; clamped", "asked", budget, "cap", s.cfg.maxBudget)
		budget = s.cfg.maxBudget
	}
	resumeAfter = m.ResumeAfter
	if resumeAfter <= 0 {
		resumeAfter = DefaultResumeAfter
	}
	return budget, min(resumeAfter, s.cfg.maxSuspend)
}

// runBefore runs the before-checkpoint hooks within budget; kcr hanging up
// on c cancels them.
func (s *Server) runBefore(cyc *cycle, c *net.UnixConn, m proto.Message, budget time.Duration) ([]Report, error) {
	ctx, cancel := context.WithTimeout(withLeaveRunning(context.Background(), m.Leave), budget)
	defer cancel()
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	if m.RequireDrained {
		ctx = WithRequireDrained(ctx)
	}
	hup, stopWatch := hangup(c)
	defer stopWatch()
	hooksDone := make(chan struct{})
	defer close(hooksDone)
	go func() {
		select {
		case <-hup:
			s.cfg.log.Warn("kcr went away while the before-checkpoint hooks ran; cancelling them")
			cancelCause(errKCRGone)
		case <-hooksDone:
		}
	}()
	return cyc.before(ctx)
}

// refuse resumes every resource after failed before-checkpoint hooks and
// tells kcr, by answerBy at the latest: kcr gives up on its answer
// budget+5s after asking, and a resume that takes longer (a Writer
// resending to a slow broker, the usual cause of a failed checkpoint) must
// not cost kcr the answer: it goes on after it.
func (s *Server) refuse(c *net.UnixConn, cyc *cycle, reports []Report, berr error, answerBy time.Time) {
	log := s.cfg.log
	log.Warn("kcr: before-checkpoint hooks failed; resuming", "err", berr)
	s.setState("resuming")
	resumed := make(chan []Report, 1)
	go func() {
		actx, cancel := context.WithTimeout(context.Background(), s.cfg.afterBudget)
		_, after, aerr := cyc.after(actx, Event{Kind: Resume, Reason: "checkpoint failed: " + berr.Error()})
		cancel()
		if aerr != nil {
			log.Warn("kcr: after-restore hooks failed on resume", "err", aerr)
		}
		cyc.end()
		s.setState("idle")
		resumed <- after
	}()
	msg := proto.Message{Type: proto.TypeFailed, Reports: reports, Error: berr.Error()}
	timer := time.NewTimer(time.Until(answerBy))
	defer timer.Stop()
	select {
	case after := <-resumed:
		msg.Reports = append(msg.Reports, after...)
		s.reply(c, msg)
		c.Close()
	case <-timer.C:
		log.Warn("kcr: the resume after a failed checkpoint is still running; answering kcr now")
		s.reply(c, msg)
		c.Close()
		<-resumed
	}
}

// quitting reports whether the server was closed (Close, Shutdown).
func (s *Server) quitting() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}

// abortClosed resumes the app when the server was closed while the hooks
// ran: await would resume at once, so the CLI must not be told to dump.
func (s *Server) abortClosed(c *net.UnixConn, cyc *cycle) {
	s.setState("resuming")
	actx, cancel := context.WithTimeout(context.Background(), s.cfg.afterBudget)
	cyc.after(actx, Event{Kind: Resume, Reason: "control socket closed during checkpoint"})
	cancel()
	cyc.end()
	s.setState("idle")
	s.reply(c, proto.Message{Type: proto.TypeError, Error: "the control socket was closed during the before-checkpoint hooks; the app resumed"})
	c.Close()
}

// ready tells kcr the app is quiesced, then waits for what comes next
// (await) and says what it was, with kcr's follow-up if one came.
func (s *Server) ready(c *net.UnixConn, st0 uint64, resumeAfter time.Duration, kcr peer, reports []Report) (Event, *followup) {
	// Open the follow-up channel first, then answer and close the
	// connection, so CRIU sees no half of a Unix connection to the CLI.
	ch := make(chan followup, 1)
	s.mu.Lock()
	s.followups = ch
	s.state = "waiting"
	s.mu.Unlock()
	werr := s.reply(c, proto.Message{Type: proto.TypeReady, PID: s.hostPID(), StartTime: st0, Reports: reports})
	c.Close()

	var ev Event
	var f *followup
	if werr != nil {
		// The CLI is gone (it gave up waiting for the hooks, or died): nobody
		// will dump this process, so do not stay suspended for resumeAfter.
		s.cfg.log.Warn("kcr: could not send ready; resuming", "err", werr)
		ev = Event{Kind: Resume, Reason: "kcr went away before the checkpoint: " + werr.Error()}
	} else {
		ev, f = s.await(ch, st0, resumeAfter, kcr)
	}

	s.mu.Lock()
	s.followups = nil
	// A follow-up that came in after await stopped listening gets an answer.
	for drained := false; !drained; {
		select {
		case g := <-ch:
			g.reply <- proto.Message{Type: proto.TypeError, Error: "the checkpoint is no longer waiting for a follow-up: " + ev.Reason}
		default:
			drained = true
		}
	}
	s.state = "restoring"
	s.mu.Unlock()
	return ev, f
}

// finish runs the after-restore hooks of ev, ends the cycle and answers
// kcr's follow-up f, if any.
func (s *Server) finish(cyc *cycle, ev Event, f *followup) {
	abudget := s.cfg.afterBudget
	if f != nil && f.msg.Wait > 0 {
		abudget = max(abudget, f.msg.Wait)
	}
	actx, cancel := context.WithTimeout(context.Background(), abudget)
	ev, after, aerr := cyc.after(actx, ev)
	cancel()
	if ev.Kind == Restore {
		// Before end, so that watch does not take this restore for another.
		st, _ := s.cfg.instance(s.pid)
		s.mu.Lock()
		s.knownStart = st
		s.mu.Unlock()
	}
	late := cyc.end()
	s.setState("idle")
	s.logAfter(ev, aerr)
	if len(late) > 0 {
		s.cfg.log.Warn("kcr: resources registered during the checkpoint join from the next one", "resources", late)
	}
	if f != nil {
		f.reply <- s.done(ev, after, aerr)
	}
}

// requestBudget is the hook budget kcr waits for, from the request: kcr
// waits that plus 5 s for the answer to a checkpoint.
func requestBudget(m proto.Message) time.Duration {
	if m.HookBudget <= 0 {
		return DefaultHookBudget
	}
	return m.HookBudget
}

// logAfter logs the end of the after-restore hooks.
func (s *Server) logAfter(ev Event, aerr error) {
	lvl := slog.LevelInfo
	if aerr != nil {
		lvl = slog.LevelWarn
	}
	s.cfg.log.Log(context.Background(), lvl, "kcr: after-restore hooks done", "kind", ev.Kind.String(), "reason", ev.Reason,
		"generation", ev.Generation, "instance_id", ev.InstanceID, "self_detected", ev.SelfDetected, "err", aerr)
}

// done is the answer to a follow-up once the after-restore hooks ran.
func (s *Server) done(ev Event, after []Report, aerr error) proto.Message {
	m := proto.Message{Type: proto.TypeDone, PID: s.hostPID(), Reports: after, InstanceID: ev.InstanceID,
		AppGeneration: ev.Generation, State: ev.Kind.String(), Kind: ev.Kind.String()}
	if aerr != nil {
		m.Error = aerr.Error()
	}
	return m
}

// await waits for the CLI's follow-up, the deadline, kcr's death, or the
// sign that the process was restored (its start time changed), and says what
// happened. A restore is checked first: a restored copy outlives the kcr
// that dumped it, and is a new instance all the same.
func (s *Server) await(ch chan followup, st0 uint64, resumeAfter time.Duration, kcr peer) (Event, *followup) {
	deadline := time.NewTimer(resumeAfter)
	defer deadline.Stop()
	poll := time.NewTicker(s.cfg.pollEvery)
	defer poll.Stop()
	restored := func() bool {
		st, err := s.cfg.instance(s.pid)
		return err == nil && st != st0
	}
	// graceWait runs once the process knows it was restored but kcr's
	// message has not come yet: give it a moment, it carries the restore
	// generation.
	graceWait := func() (Event, *followup) {
		grace := time.NewTimer(s.cfg.restoreWait)
		defer grace.Stop()
		selfDetected := Event{Kind: Restore, Reason: "restored (kcr's after-restore message did not arrive)", SelfDetected: true}
		select {
		case f := <-ch:
			return s.eventFor(f, true), &f
		case <-grace.C:
			return selfDetected, nil
		case <-s.quit:
			return selfDetected, nil
		}
	}
	for {
		select {
		case f := <-ch:
			r := restored()
			if r {
				s.rebind(s.cfg.hostPID())
			}
			return s.eventFor(f, r), &f
		case <-poll.C:
			if restored() {
				s.rebind(s.cfg.hostPID())
				return graceWait()
			}
			if kcr.gone() {
				s.cfg.log.Warn("kcr exited before its follow-up; resuming", "kcr_pid", kcr.pid)
				return Event{Kind: Resume, Reason: fmt.Sprintf("kcr (PID %d) exited before its follow-up", kcr.pid)}, nil
			}
		case <-s.quit:
			if restored() {
				return graceWait()
			}
			return Event{Kind: Resume, Reason: "control socket closed during checkpoint"}, nil
		case <-deadline.C:
			// After a restore the monotonic clock may be far ahead of the
			// dumped process's, so this timer fires at once: the restore must
			// still wait for kcr's message.
			if restored() {
				s.rebind(s.cfg.hostPID())
				return graceWait()
			}
			s.cfg.log.Warn("kcr: no follow-up from kcr after checkpoint; resuming on our own", "after", resumeAfter)
			return Event{Kind: Resume, Reason: fmt.Sprintf("no follow-up from kcr within %v", resumeAfter)}, nil
		}
	}
}

func (s *Server) eventFor(f followup, restored bool) Event {
	m := f.msg
	if m.Type == proto.TypeRestored || restored {
		// The start time is the ground truth: a "resume" sent to a restored
		// copy still makes it a new instance.
		return Event{Kind: Restore, Generation: m.Generation, Name: m.Name, Reason: "restored"}
	}
	reason := m.Reason
	if reason == "" {
		reason = "resumed"
	}
	return Event{Kind: Resume, Reason: reason}
}
