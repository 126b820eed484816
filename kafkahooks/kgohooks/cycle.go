package kgohooks

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/internal/quiesce"
	"github.com/kcr-dev/kcr/notify"
)

// share returns a context that ends when frac of ctx's remaining time has
// passed.
func share(ctx context.Context, frac float64) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Duration(float64(time.Until(deadline))*frac)))
}

// waitCleared polls b every millisecond until it is false or ctx ends: the
// application clears it, with no signal to wait on.
func waitCleared(ctx context.Context, b *atomic.Bool) {
	for b.Load() && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
}

// retry calls fn until it succeeds or ctx ends, with backoff.
func (c *core) retry(ctx context.Context, what string, fn func(context.Context) error) (int, error) {
	attempts := 0
	for d := c.cfg.backoffMin; ; d = min(2*d, c.cfg.backoffMax) {
		attempts++
		err := fn(ctx)
		if err == nil {
			return attempts, nil
		}
		if ctx.Err() != nil {
			return attempts, fmt.Errorf("%s: %w (after %d attempts; %v)", what, err, attempts, context.Cause(ctx))
		}
		c.cfg.log.Debug("retrying", "what", what, "err", err, "attempt", attempts)
		select {
		case <-ctx.Done():
			return attempts, fmt.Errorf("%s: %w (after %d attempts; %v)", what, err, attempts, context.Cause(ctx))
		case <-time.After(d):
		}
	}
}

// BeforeCheckpoint implements notify.Resource; see the package documentation.
func (c *core) BeforeCheckpoint(ctx context.Context) error {
	start := time.Now()
	c.mu.Lock()
	if c.closed || c.gate != nil {
		c.mu.Unlock()
		return nil
	}
	c.gate = make(chan struct{})
	s := c.state.Load()
	// A group member with BlockRebalanceOnPoll can leave only once the
	// application allowed rebalances: until then it may go on producing.
	waitAllow := c.blockRebalance && c.group != "" && !notify.LeaveRunning(ctx)
	gated := &state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: c.gate, txnPass: true, commitPass: true, workPass: waitAllow, stop: s.stop, cancel: s.cancel}
	c.state.Store(gated)
	s.cancel() // ends waiting polls
	starts := c.starts
	c.recorded = nil
	resolving, stopResolv := c.resolving, c.stopResolv
	clientID, txnID, instanceID := c.clientID, c.txnID, c.instanceID
	c.mu.Unlock()

	cp := &Checkpoint{}
	rep := Report{Phase: "before-checkpoint", ClientID: clientID, TransactionalID: txnID, InstanceID: instanceID, Checkpoint: cp}
	if c.group != "" {
		cp.GroupCheckpoint = &GroupCheckpoint{Group: c.group}
	}
	finish := func(err error) error {
		rep.CallersBlocked = c.blocked.Load()
		rep.DurationMS = time.Since(start).Milliseconds()
		if err != nil {
			cp.Error = err.Error()
			c.cfg.log.Warn("checkpoint refused; the client goes on unchanged", "err", err)
		} else {
			c.cfg.log.Debug("kgo client quiesced", "report", rep)
		}
		c.reports.Store(rep)
		return err
	}

	// Direct partitions: every start offset must be exact before the dump.
	if resolving != nil {
		rctx, cancel := share(ctx, 0.5)
		select {
		case <-resolving:
		case <-rctx.Done():
		}
		cancel()
		if c.pos.unresolved() > 0 {
			stopResolv()
			<-resolving
			c.mu.Lock()
			err := c.bgErr
			c.mu.Unlock()
			return finish(fmt.Errorf("kgohooks: the start offsets of %d direct partitions are not resolved yet (%v): a restored client would skip records", c.pos.unresolved(), err))
		}
	}

	pctx, cancel := share(ctx, 0.2)
	quiesce.WaitZero(pctx, &c.polls)
	cancel()

	if waitAllow {
		actx, cancel := share(ctx, 0.5)
		waitCleared(actx, &c.held)
		cancel()
		c.mu.Lock()
		c.state.Store(&state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: c.gate, txnPass: true, commitPass: true, stop: s.stop, cancel: s.cancel})
		c.mu.Unlock()
		if c.held.Load() {
			return finish(fmt.Errorf("%w within half the hook budget; call AllowRebalance when done with each poll (kgo's documented loop), or give the checkpoint a longer --timeout", ErrRebalanceBlocked))
		}
	}

	// An open transaction: let the application end it, then apply the policy.
	if c.baseTxnID != "" {
		tctx, cancel := share(ctx, 0.5)
		waitCleared(tctx, &c.txnOpen)
		cancel()
		cp.Transaction = "none"
		if c.txnOpen.Load() {
			if c.cfg.openTxn == FailOnOpenTxn {
				cp.Transaction = "open"
				return finish(fmt.Errorf("%w at the checkpoint and the application did not end it within half the hook budget; end it before checkpointing, or choose AbortOpenTxn or CommitOpenTxn", ErrOpenTxn))
			}
			c.mu.Lock()
			c.state.Store(&state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: c.gate, commitPass: true, stop: s.stop, cancel: s.cancel})
			c.mu.Unlock()
			ectx, cancel := share(ctx, 0.6)
			quiesce.WaitZero(ectx, &c.calls)
			cancel()
			var err error
			cp.Transaction, err = c.endOpenTxn(ctx, s)
			if err != nil && c.cfg.txnID == SuffixTxnID {
				// Restored under another transactional id, nothing would
				// end it: read_committed readers of its partitions would
				// wait for transaction.timeout.ms. (With KeepTxnID the
				// restored client's InitProducerID aborts it.)
				return finish(fmt.Errorf("kgohooks: the transaction open at the checkpoint could not be aborted (%w); the checkpoint is refused because a copy restored under a new transactional id (SuffixTxnID) could not end it, and read_committed readers would stall until transaction.timeout.ms", err))
			}
		}
	}

	// Flush: nothing may be carried in the image under this producer id.
	fctx, cancel := share(ctx, 0.7)
	quiesce.WaitZero(fctx, &c.calls)
	buffered := s.cl.BufferedProduceRecords()
	err := s.cl.Flush(fctx)
	cancel()
	left := s.cl.BufferedProduceRecords()
	cp.RecordsFlushed = max(buffered-left, 0)
	if err != nil || left > 0 {
		cp.RecordsUnflushed = left
		// A carry veto (kcr exits 10), like --require-drained's for kafkahooks.
		return finish(&notify.CarryError{Records: left, Err: fmt.Errorf("%w: %d of %d buffered records still unacknowledged (%v); the checkpoint is refused so that no record is carried in the image under producer id of client %q", ErrRecordsNotFlushed, left, buffered, err, clientID)})
	}

	// Commit what the group handed out, then leave the group.
	c.mu.Lock()
	c.state.Store(&state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: c.gate, stop: s.stop, cancel: s.cancel})
	c.mu.Unlock()
	if c.group != "" && !c.session {
		cctx, cancel := share(ctx, 0.7)
		quiesce.WaitZero(cctx, &c.calls)
		n, attempts, err := c.commitHanded(cctx, s.cl)
		cancel()
		cp.PartitionsCommitted, cp.CommitAttempts = n, attempts
		if err != nil {
			return finish(fmt.Errorf("kgohooks: committing the offsets handed out before the checkpoint: %w", err))
		}
		cp.StaleCommits = c.marks.staleCommits()
	}
	if c.group != "" && starts != nil {
		pctx, cancel := share(ctx, 0.7)
		n, rec, err := c.pinStarts(pctx, s.cl, starts)
		cancel()
		if err != nil {
			return finish(fmt.Errorf("kgohooks: pinning the start offsets of partitions the group has no commit for: %w", err))
		}
		cp.PartitionsPinned, cp.OffsetsRecorded = n, len(rec)
		c.mu.Lock()
		c.recorded = rec
		c.mu.Unlock()
	}
	if c.pos != nil {
		if next := c.pos.report(); len(next) > 0 {
			cp.NextOffsets = next
		}
	}
	if c.tpos != nil {
		tctx, cancel := share(ctx, 0.7)
		err := c.tpos.checkpoint(tctx, s.cl, slices.Clone(c.topics), c.readCommitted)
		cancel()
		if err != nil {
			return finish(fmt.Errorf("kgohooks: the positions of the consumed topics' partitions: %w", err))
		}
		if next := c.tpos.report(); len(next) > 0 {
			cp.NextOffsets = next
		}
	}
	// Without a group nothing ties this client to the broker but its
	// connections: close them and keep it, so that a resume goes on with
	// the same client and producer id; a restore replaces it. A group
	// member is kept too when the process is meant to go on
	// (--leave-running): it stays in the group, and a copy restored from
	// the image replaces its client without leaving (its dials fail), so
	// the original keeps its membership.
	if c.group == "" || notify.LeaveRunning(ctx) {
		kept := &KeptClient{KeptForResume: true, ConnectionsClosed: s.dial.CloseAll(false)}
		cp.KeptClient = kept
		c.mu.Lock()
		c.cut = true
		c.mu.Unlock()
		kept.ConnectionsOpen = s.dial.Open()
		return finish(nil)
	}
	// Otherwise a group member leaves, so that the others take its
	// partitions at once. kgo cannot rejoin a group it left (the group
	// consumer it left is done for good), so its client is closed and
	// replaced even on a resume.
	c.mu.Lock()
	c.torn = true
	c.mu.Unlock()
	lctx, cancel := share(ctx, 0.8)
	memberID, _ := s.cl.GroupMetadata()
	cp.InitialDelay = c.leavesGroupEmpty(lctx, s, memberID)
	err = s.cl.LeaveGroupContext(lctx)
	if instanceID != "" {
		// kgo leaves a static member in the group, or fails to leave it
		// (static.go).
		err = c.leaveStatic(lctx, s.cl, memberID, instanceID)
	}
	cancel()
	cp.LeftGroup = err == nil
	if err != nil {
		c.cfg.log.Warn("leaving the group before the checkpoint", "err", err)
	}
	closing := startClose(s)
	if err := waitClosed(ctx, closing); err != nil {
		c.mu.Lock()
		c.closing = closing // the resume waits for it
		c.mu.Unlock()
		return finish(err)
	}
	c.mu.Lock()
	c.shut = true
	c.mu.Unlock()
	cp.Closed = true
	return finish(nil)
}

// closeWithin closes s's kgo client (or session), waiting until ctx ends.
func closeWithin(ctx context.Context, s *state) error {
	return waitClosed(ctx, startClose(s))
}

// startClose closes s's kgo client (or session) in the background; the
// channel is closed when it is. A kgo client is closed once: a second Close
// would run kgo's OnClientClosed hooks again.
func startClose(s *state) <-chan struct{} {
	closed := make(chan struct{})
	go func() {
		if s.sess != nil {
			s.sess.Close()
		} else {
			s.cl.Close()
		}
		close(closed)
	}()
	return closed
}

func waitClosed(ctx context.Context, closed <-chan struct{}) error {
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kgohooks: the kgo client did not close within the hook budget: %v", context.Cause(ctx))
	}
}

// commitHanded commits, with retries, what kgo's autocommit would commit:
// all polled records, or those marked (AutoCommitMarks). With
// DisableAutoCommit the application's own commits have ended (the gate
// waited for them), so nothing is left to commit.
func (c *core) commitHanded(ctx context.Context, cl *kgo.Client) (int, int, error) {
	var offs map[string]map[int32]kgo.EpochOffset
	var commit func(context.Context) error
	switch c.commit {
	case commitAuto:
		offs, commit = cl.UncommittedOffsets(), cl.CommitUncommittedOffsets
	case commitMarks:
		offs, commit = cl.MarkedOffsets(), cl.CommitMarkedOffsets
	default:
		return 0, 0, nil
	}
	n := 0
	for _, ps := range offs {
		n += len(ps)
	}
	if n == 0 {
		return 0, 0, nil
	}
	attempts, err := c.retry(ctx, "commit", commit)
	return n, attempts, err
}

// endOpenTxn ends the application's open transaction by the policy and
// returns what it did, for the report, and the error if it could not end it.
func (c *core) endOpenTxn(ctx context.Context, s *state) (string, error) {
	commit := c.cfg.openTxn == CommitOpenTxn
	var err error
	committed := false
	switch {
	case s.sess != nil:
		committed, err = s.sess.End(ctx, kgo.TransactionEndTry(commit))
	case commit:
		if err = s.cl.Flush(ctx); err == nil {
			err = s.cl.EndTransaction(ctx, kgo.TryCommit)
			committed = err == nil
		}
	default:
		if err = s.cl.AbortBufferedRecords(ctx); err == nil {
			err = s.cl.EndTransaction(ctx, kgo.TryAbort)
		}
	}
	if err != nil && !committed && s.sess == nil {
		// A failed commit is retried as an abort, as kgo's documentation
		// says. kgo may answer that retry with nil when it could not
		// reach the coordinator: it fails the producer id so that this
		// client's next InitProducerID aborts the transaction. A copy
		// restored under another transactional id never sends that, so
		// a failed first attempt stands.
		first := err
		s.cl.AbortBufferedRecords(ctx)
		if err = s.cl.EndTransaction(ctx, kgo.TryAbort); err == nil {
			err = first
		}
	}
	c.txnOpen.Store(false)
	if committed {
		return "committed", nil
	}
	c.txnAborted.Store(true)
	if err != nil {
		c.cfg.log.Warn("aborting the open transaction before the checkpoint", "err", err)
		return "abort failed (" + err.Error() + ")", err
	}
	return "aborted", nil
}

// AfterRestore implements notify.Resource; see the package documentation.
func (c *core) AfterRestore(ctx context.Context, ev notify.Event) error {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.gate == nil {
		return nil
	}
	if ev.Kind == notify.Restore {
		short := ev.ShortID()
		c.clientID = c.baseClientID + "-" + short
		if c.baseTxnID != "" && c.cfg.txnID == SuffixTxnID {
			c.txnID = c.baseTxnID + "-" + short
		}
		c.instanceID = c.restoredInstanceID(short)
	}
	rs := &Restore{Event: ev.Kind.String()}
	rep := Report{Phase: "after-restore", ClientID: c.clientID, TransactionalID: c.txnID, InstanceID: c.instanceID, Restore: rs}
	s := c.state.Load()
	var err error
	switch {
	case c.cut && ev.Kind == notify.Resume:
		// The same kgo client goes on: its dials may reach the broker again.
		s.dial.Resume()
		s = newState(s.cl, s.sess, s.dial, s.gen)
	case c.torn || c.cut:
		switch {
		case c.cut:
			// A restored copy must not write as the original: the old
			// client's dials fail from now on, and it is closed (a group
			// member's LeaveGroup cannot reach the broker, so it does not
			// remove the original, which may run on). Its rebalances are
			// allowed first (a poll of the image may block them) and its
			// leave is not waited for: it cannot be sent.
			s.dial.CloseAll(true)
			s.cl.AllowRebalance()
			if c.group != "" {
				gone, cancel := context.WithCancel(ctx)
				cancel()
				s.cl.LeaveGroupContext(gone)
			}
			if cerr := closeWithin(ctx, s); cerr != nil {
				c.cfg.log.Warn("closing the kgo client of the image", "err", cerr)
			}
		case !c.shut:
			// The member began leaving but its client did not close
			// within the budget (the checkpoint was refused): close it
			// before building the next, so that it neither stays in the
			// group nor lives beside the new one.
			s.cl.AllowRebalance()
			closing := c.closing
			if closing == nil {
				closing = startClose(s)
			}
			if cerr := waitClosed(ctx, closing); cerr != nil {
				c.cfg.log.Warn("closing the kgo client that left the group", "err", cerr)
			}
		}
		var cl *kgo.Client
		var sess *kgo.GroupTransactSession
		var dial *conntrack.Tracker
		c.recordedRestored.Store(0)
		cl, sess, dial, err = c.build()
		if err == nil {
			c.gen++
			if c.marks != nil {
				c.marks.rotate()
			}
			s = newState(cl, sess, dial, c.gen)
			c.startResolve(cl)
			rs.NewClient = true
		}
	default:
		s = newState(s.cl, s.sess, s.dial, s.gen)
		if c.resolving != nil && c.pos.unresolved() > 0 {
			c.startResolve(s.cl)
		}
	}
	if err != nil {
		// Cannot happen with options NewClient accepted; fail calls
		// rather than leave them waiting.
		c.closed = true
		s = &state{cl: s.cl, closed: true, gate: make(chan struct{}), stop: s.stop, cancel: s.cancel}
		err = fmt.Errorf("kgohooks: new kgo client: %w", err)
	}
	if c.tpos != nil && err == nil {
		c.tpos.restart(s.cl) // a new client, or one whose buffer the checkpoint drained
	}
	c.torn, c.cut, c.shut, c.closing = false, false, false, nil
	c.recorded = nil // used by the new client's build, if any
	c.state.Store(s)
	close(c.gate)
	c.gate = nil
	rep.CallersBlocked = c.blocked.Load()
	rep.DurationMS = time.Since(start).Milliseconds()
	c.repMu.Lock()
	rs.RecordedOffsetsRestored = int(c.recordedRestored.Load())
	c.reports.Store(rep)
	c.repMu.Unlock()
	if err == nil && ev.Kind == notify.Restore && c.sasl {
		err = checkAuth(ctx, s.cl)
	}
	return err
}
