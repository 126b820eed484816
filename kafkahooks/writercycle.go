package kafkahooks

import (
	"context"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// BeforeCheckpoint implements notify.Resource; see the type's documentation.
func (w *Writer) BeforeCheckpoint(ctx context.Context) error {
	start := time.Now()
	c, ok := w.startCycle()
	if !ok {
		return nil
	}
	drained, completions := w.waitDrained(ctx, c.done)
	w.mu.Lock()
	conns := 0
	if w.inCycle && w.cycle == c.cycle {
		// Not when this hook overran its budget, was left behind and the
		// after-restore hook has installed the next transport meanwhile.
		conns = w.transport.pause()
	}
	w.mu.Unlock()

	carried := int64(0)
	if !drained {
		carried = w.records()
	}
	elapsed := time.Since(start)
	rep := WriterReport{
		Phase:          "before-checkpoint",
		ClientID:       c.clientID,
		RecordsCarried: carried,
		CallersBlocked: w.blocked.Load(),
		DurationMS:     elapsed.Milliseconds(),
		WriterCheckpoint: &WriterCheckpoint{
			Async:              w.async,
			Drained:            drained,
			RecordsPending:     c.pending,
			RecordsDrained:     max(c.pending-carried, 0),
			CompletionsPending: completions,
			ConnectionsClosed:  conns,
		},
	}
	w.reports.Store(rep)
	// Declared even when zero; under --require-drained a carry vetoes the
	// dump: every resource resumes and the records are sent on resume.
	if err := notify.Carrying(ctx, carried); err != nil {
		w.cfg.log.Warn("kafka writer would carry records across the checkpoint, which asked for none; refusing it",
			"records_carried", carried, "records_drained", rep.RecordsDrained, "duration", elapsed)
		return err
	}
	if drained {
		w.cfg.log.Debug("kafka writer quiesced", "records_drained", c.pending, "callers_blocked", rep.CallersBlocked, "duration", elapsed)
	} else {
		w.cfg.log.Warn("kafka writer could not drain within the checkpoint budget; unacknowledged records are carried across the checkpoint and sent after restore",
			"records_carried", carried, "records_drained", rep.RecordsDrained, "callers_blocked", rep.CallersBlocked, "duration", elapsed, "cause", context.Cause(ctx))
	}
	return nil
}

// writerCycle is one before-checkpoint as startCycle began it.
type writerCycle struct {
	cycle    uint64
	pending  int64         // records handed to the Writer and not yet acknowledged
	done     chan struct{} // closed when the kafka.Writer being drained has closed
	clientID string
}

// startCycle closes the gate to new records and starts closing the
// kafka.Writer, which drains it; ok is false for a closed Writer.
func (w *Writer) startCycle() (c writerCycle, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return c, false
	}
	w.inCycle = true
	w.cycle++
	c.cycle = w.cycle
	if w.cb != nil {
		// From now on the closing kafka.Writer does not wait for user
		// Completions, which may wait at a gate of this checkpoint.
		w.cb.detach()
	}
	c.pending = w.records()
	if w.closing == nil {
		w.closing = make(chan struct{})
		s := w.state.Load()
		w.state.Store(&writerState{gate: w.closing})
		done := make(chan struct{})
		w.closeDone = done
		inner := s.w
		go func() {
			w.closeInner(inner)
			w.absorb(inner)
			close(done)
		}()
	}
	// Otherwise the gate is still closed since the previous cycle, whose
	// carried records are still being resent: keep waiting for them.
	c.done = w.closeDone
	c.clientID = w.currentClientID()
	return c, true
}

// waitDrained waits for the drain to end, within the hook's budget less a
// reserve, then, when it did, a moment for the last Completions; it
// returns whether it drained and the Completions still pending.
func (w *Writer) waitDrained(ctx context.Context, done <-chan struct{}) (drained bool, completions int) {
	dctx, cancel := drainContext(ctx)
	defer cancel()
	select {
	case <-done:
	case <-dctx.Done():
		return false, 0
	}
	if w.cb != nil {
		// Give Completions a moment; one waiting at another gate of this
		// checkpoint is delivered after it.
		gctx, gcancel := context.WithTimeout(dctx, completionGrace)
		w.cb.wait(gctx.Done())
		gcancel()
		completions = w.cb.pending()
	}
	return true, completions
}

// completionGrace bounds how long a drained Writer's before-checkpoint hook
// waits for the last Completions.
const completionGrace = 100 * time.Millisecond

// drainReserve is the share of the remaining budget a before-checkpoint hook
// leaves unused when it waits for a drain that does not finish, so that the
// hooks after it (resources registered earlier) still get time.
const drainReserve = 10

// drainContext returns ctx shortened by a tenth of its remaining time (at
// most a second): how long a hook may wait for a drain.
func drainContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := min(time.Until(deadline)/drainReserve, time.Second)
	return context.WithDeadline(ctx, deadline.Add(-reserve))
}

// AfterRestore implements notify.Resource; see the type's documentation.
func (w *Writer) AfterRestore(ctx context.Context, ev notify.Event) error {
	start := time.Now()
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.inCycle = false
	w.renewClientID(ev)
	clientID := w.currentClientID()
	w.transport.resume(clientID)
	done := w.closeDone
	carried := w.records()
	w.mu.Unlock()

	open := true
	var cause error // why the wait for the carried records ended early
	if done != nil {
		dctx, cancel := drainContext(ctx)
		select {
		case <-done:
		case <-dctx.Done():
			open = false
			// dctx ends before ctx (a reserve for the report), so ctx's
			// own cause is still nil here.
			cause = context.Cause(dctx)
		}
		cancel()
	}
	pendingNow := w.records()
	if open {
		w.open()
	} else {
		w.mu.Lock()
		if !w.closed {
			w.bg.Add(1)
			go func() {
				defer w.bg.Done()
				select {
				case <-done:
					w.open()
					w.cfg.log.Info("kafka writer delivered the records carried across the checkpoint; writes resume", "duration", time.Since(start))
				case <-w.done:
				}
			}()
		}
		w.mu.Unlock()
		w.cfg.log.Warn("kafka writer could not deliver carried records within the after-restore budget; resending in the background, writes stay blocked until then",
			"records_carried", w.records(), "cause", cause)
	}
	w.reports.Store(WriterReport{
		Phase:          "after-restore",
		ClientID:       clientID,
		RecordsCarried: carried,
		CallersBlocked: w.blocked.Load(),
		DurationMS:     time.Since(start).Milliseconds(),
		WriterRestore: &WriterRestore{
			Event:               ev.Kind.String(),
			RecordsDelivered:    max(carried-pendingNow, 0),
			GateOpen:            open,
			RequestsInterrupted: w.transport.interrupted.Load(),
			RecordsInterrupted:  w.interruptedRecs.Load(),
			RecordsFailed:       w.transport.failed.Load(),
		},
	})
	if ev.Kind != notify.Restore || w.tmpl.w.Addr == nil {
		return nil
	}
	tt := w.transport.tmpl
	return checkAuth(ctx, w.tmpl.w.Addr.String(), tt.dial, tt.tls, tt.sasl, clientID)
}

// open creates the next kafka.Writer and opens the gate, unless the Writer
// was closed or another checkpoint has begun (its AfterRestore opens it).
func (w *Writer) open() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.inCycle || w.closing == nil {
		return
	}
	w.transport.endCarry()
	if w.cb != nil {
		w.cb.attach()
	}
	inner := w.newInner()
	w.statsSrc = inner
	w.closeDone = nil
	w.state.Store(&writerState{w: inner})
	close(w.closing)
	w.closing = nil
}

// CheckpointReport implements notify.Reporter: Report as a map, which lands
// in the image manifest; nil before the first hook run.
func (w *Writer) CheckpointReport() map[string]any { return w.reports.Map() }

// Report returns the report of the last hook run, and false before the
// first one. Its parts are shared: do not modify them.
func (w *Writer) Report() (WriterReport, bool) { return w.reports.Load() }
