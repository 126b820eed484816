package kgohooks

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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
// It gates the client, then runs the steps in order; the first that fails
// refuses the checkpoint and the client goes on unchanged.
func (c *core) BeforeCheckpoint(ctx context.Context) error {
	r := c.gateForCheckpoint(ctx)
	if r == nil {
		return nil
	}
	for _, step := range []func(context.Context) error{
		r.resolveDirectStarts,
		r.waitPolls,
		r.waitAllowRebalance,
		r.endTransaction,
		r.flush,
		r.commitGroup,
		r.pinGroupStarts,
		r.recordPositions,
	} {
		if err := step(ctx); err != nil {
			return r.finish(err)
		}
	}
	if c.group == "" || notify.LeaveRunning(ctx) {
		r.keepClient()
		return r.finish(nil)
	}
	return r.finish(r.leaveAndClose(ctx))
}

// checkpointRun is what one BeforeCheckpoint's steps share: the client's
// state when the gate closed, and the report they fill in.
type checkpointRun struct {
	c          *core
	start      time.Time
	s          *state // the client's state before the gate closed
	waitAllow  bool
	starts     *groupStarts
	resolving  chan struct{}
	stopResolv context.CancelFunc
	clientID   string
	instanceID string
	cp         *Checkpoint
	rep        Report
}

// gateForCheckpoint closes the gate, so that new calls wait, and ends waiting
// polls; nil when the client is closed or a checkpoint is already running.
func (c *core) gateForCheckpoint(ctx context.Context) *checkpointRun {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.gate != nil {
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
	c.recorded = nil
	cp := &Checkpoint{}
	if c.group != "" {
		cp.GroupCheckpoint = &GroupCheckpoint{Group: c.group}
	}
	return &checkpointRun{
		c: c, start: start, s: s, waitAllow: waitAllow, starts: c.starts,
		resolving: c.resolving, stopResolv: c.stopResolv,
		clientID: c.clientID, instanceID: c.instanceID, cp: cp,
		rep: Report{Phase: "before-checkpoint", ClientID: c.clientID, TransactionalID: c.txnID, InstanceID: c.instanceID, Checkpoint: cp},
	}
}

// finish stores the run's report, so that the manifest says what happened,
// and returns err.
func (r *checkpointRun) finish(err error) error {
	r.rep.CallersBlocked = r.c.blocked.Load()
	r.rep.DurationMS = time.Since(r.start).Milliseconds()
	if err != nil {
		r.cp.Error = err.Error()
		r.c.cfg.log.Warn("checkpoint refused; the client goes on unchanged", "err", err)
	} else {
		r.c.cfg.log.Debug("kgo client quiesced", "report", r.rep)
	}
	r.c.reports.Store(r.rep)
	return err
}

// setState publishes the gate's next passes under c.mu.
func (r *checkpointRun) setState(txnPass, commitPass bool) {
	s := r.s
	r.c.mu.Lock()
	r.c.state.Store(&state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: r.c.gate, txnPass: txnPass, commitPass: commitPass, stop: s.stop, cancel: s.cancel})
	r.c.mu.Unlock()
}

// resolveDirectStarts waits for the start offsets of direct partitions: a
// restored client would skip records from a start that is not exact.
func (r *checkpointRun) resolveDirectStarts(ctx context.Context) error {
	c := r.c
	if r.resolving == nil {
		return nil
	}
	rctx, cancel := share(ctx, 0.5)
	select {
	case <-r.resolving:
	case <-rctx.Done():
	}
	cancel()
	if c.pos.unresolved() == 0 {
		return nil
	}
	r.stopResolv()
	<-r.resolving
	c.mu.Lock()
	err := c.bgErr
	c.mu.Unlock()
	return fmt.Errorf("kgohooks: the start offsets of %d direct partitions are not resolved yet (%v): a restored client would skip records", c.pos.unresolved(), err)
}

// waitPolls lets the polls already running return what they fetched, for a
// while, so that the application can mark it before the commit.
func (r *checkpointRun) waitPolls(ctx context.Context) error {
	pctx, cancel := share(ctx, 0.2)
	quiesce.WaitZero(pctx, &r.c.polls)
	cancel()
	return nil
}

// waitAllowRebalance waits for a BlockRebalanceOnPoll member's AllowRebalance:
// leaving the group before it would rebalance under the application's feet.
func (r *checkpointRun) waitAllowRebalance(ctx context.Context) error {
	if !r.waitAllow {
		return nil
	}
	actx, cancel := share(ctx, 0.5)
	waitCleared(actx, &r.c.held)
	cancel()
	r.setState(true, true)
	if r.c.held.Load() {
		return fmt.Errorf("%w within half the hook budget; call AllowRebalance when done with each poll (kgo's documented loop), or give the checkpoint a longer --hook-budget", ErrRebalanceBlocked)
	}
	return nil
}

// endTransaction lets the application end an open transaction, then applies
// the OpenTxn policy: an image must not hold a transaction nothing can end.
func (r *checkpointRun) endTransaction(ctx context.Context) error {
	c, cp := r.c, r.cp
	if c.baseTxnID == "" {
		return nil
	}
	tctx, cancel := share(ctx, 0.5)
	waitCleared(tctx, &c.txnOpen)
	cancel()
	cp.Transaction = "none"
	if !c.txnOpen.Load() {
		return nil
	}
	if c.cfg.openTxn == FailOnOpenTxn {
		cp.Transaction = "open"
		return fmt.Errorf("%w at the checkpoint and the application did not end it within half the hook budget; end it before checkpointing, or choose AbortOpenTxn or CommitOpenTxn", ErrOpenTxn)
	}
	r.setState(false, true)
	ectx, cancel := share(ctx, 0.6)
	quiesce.WaitZero(ectx, &c.calls)
	cancel()
	var err error
	cp.Transaction, err = c.endOpenTxn(ctx, r.s)
	if err != nil && c.cfg.txnID == SuffixTxnID {
		// Restored under another transactional id, nothing would
		// end it: read_committed readers of its partitions would
		// wait for transaction.timeout.ms. (With KeepTxnID the
		// restored client's InitProducerID aborts it.)
		return fmt.Errorf("kgohooks: the transaction open at the checkpoint could not be aborted (%w); the checkpoint is refused because a copy restored under a new transactional id (SuffixTxnID) could not end it, and read_committed readers would stall until transaction.timeout.ms", err)
	}
	return nil
}

// flush waits for every buffered record's acknowledgement: nothing may be
// carried in the image under this producer id.
func (r *checkpointRun) flush(ctx context.Context) error {
	cl, cp := r.s.cl, r.cp
	fctx, cancel := share(ctx, 0.7)
	quiesce.WaitZero(fctx, &r.c.calls)
	buffered := cl.BufferedProduceRecords()
	err := cl.Flush(fctx)
	cancel()
	left := cl.BufferedProduceRecords()
	cp.RecordsFlushed = max(buffered-left, 0)
	if err != nil || left > 0 {
		cp.RecordsUnflushed = left
		// A carry veto (kcr exits 10), like --require-drained's for kafkahooks.
		return &notify.CarryError{Records: left, Err: fmt.Errorf("%w: %d of %d buffered records still unacknowledged (%v); the checkpoint is refused so that no record is carried in the image under producer id of client %q", ErrRecordsNotFlushed, left, buffered, err, r.clientID)}
	}
	return nil
}

// commitGroup closes the gate's last passes, then commits what the group
// handed out: a copy restored elsewhere starts after it.
func (r *checkpointRun) commitGroup(ctx context.Context) error {
	c, cp := r.c, r.cp
	r.setState(false, false)
	if c.group == "" || c.session {
		return nil
	}
	cctx, cancel := share(ctx, 0.7)
	quiesce.WaitZero(cctx, &c.calls)
	n, attempts, err := c.commitHanded(cctx, r.s.cl)
	cancel()
	cp.PartitionsCommitted, cp.CommitAttempts = n, attempts
	if err != nil {
		return fmt.Errorf("kgohooks: committing the offsets handed out before the checkpoint: %w", err)
	}
	cp.StaleCommits = c.marks.staleCommits()
	return nil
}

// pinGroupStarts commits the start offsets of partitions the group has no
// commit for: a restored copy must start where this one did, not at the end.
func (r *checkpointRun) pinGroupStarts(ctx context.Context) error {
	c := r.c
	if c.group == "" || r.starts == nil {
		return nil
	}
	pctx, cancel := share(ctx, 0.7)
	n, rec, err := c.pinStarts(pctx, r.s.cl, r.starts)
	cancel()
	if err != nil {
		return fmt.Errorf("kgohooks: pinning the start offsets of partitions the group has no commit for: %w", err)
	}
	r.cp.PartitionsPinned, r.cp.OffsetsRecorded = n, len(rec)
	c.mu.Lock()
	c.recorded = rec
	c.mu.Unlock()
	return nil
}

// recordPositions records the next offsets of direct and consumed
// partitions: the image carries where a restored client goes on.
func (r *checkpointRun) recordPositions(ctx context.Context) error {
	c, cp := r.c, r.cp
	if c.pos != nil {
		if next := c.pos.report(); len(next) > 0 {
			cp.NextOffsets = next
		}
	}
	if c.tpos == nil {
		return nil
	}
	tctx, cancel := share(ctx, 0.7)
	err := c.tpos.checkpoint(tctx, r.s.cl, slices.Clone(c.topics), c.readCommitted)
	cancel()
	if err != nil {
		return fmt.Errorf("kgohooks: the positions of the consumed topics' partitions: %w", err)
	}
	if next := c.tpos.report(); len(next) > 0 {
		cp.NextOffsets = next
	}
	return nil
}

// keepClient closes the client's connections and keeps it. Without a group
// nothing ties this client to the broker but its connections, so a resume
// goes on with the same client and producer id; a restore replaces it. A
// group member is kept too when the process is meant to go on
// (--leave-running): it stays in the group, and a copy restored from the
// image replaces its client without leaving (its dials fail), so the
// original keeps its membership.
func (r *checkpointRun) keepClient() {
	kept := &KeptClient{KeptForResume: true, ConnectionsClosed: r.s.dial.CloseAll(false)}
	r.cp.KeptClient = kept
	r.c.mu.Lock()
	r.c.cut = true
	r.c.mu.Unlock()
	kept.ConnectionsOpen = r.s.dial.Open()
}

// leaveAndClose has a group member leave, so that the others take its
// partitions at once, and closes its client. kgo cannot rejoin a group it
// left (the group consumer it left is done for good), so the client is
// replaced even on a resume.
func (r *checkpointRun) leaveAndClose(ctx context.Context) error {
	c, s, cp := r.c, r.s, r.cp
	c.mu.Lock()
	c.torn = true
	c.mu.Unlock()
	lctx, cancel := share(ctx, 0.8)
	memberID, _ := s.cl.GroupMetadata()
	cp.InitialDelay = c.leavesGroupEmpty(lctx, s, memberID)
	err := s.cl.LeaveGroupContext(lctx)
	if r.instanceID != "" {
		// kgo leaves a static member in the group, or fails to leave it
		// (static.go).
		err = c.leaveMember(lctx, s.cl, groupMember{memberID, r.instanceID})
	}
	cancel()
	cp.LeftGroup = err == nil
	if err != nil {
		c.cfg.log.Warn("leaving the group before the checkpoint", "err", err)
		if memberID != "" {
			c.mu.Lock()
			c.unleft = &groupMember{memberID, r.instanceID}
			c.mu.Unlock()
		}
	}
	closing := startClose(s)
	if err := waitClosed(ctx, closing); err != nil {
		c.mu.Lock()
		c.closing = closing // the resume waits for it
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	c.shut = true
	c.mu.Unlock()
	cp.Closed = true
	return nil
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
		s, err = c.replaceClient(ctx, s, rs)
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

// replaceClient closes the client the checkpoint tore down or cut off and
// builds the next one: a restored copy, or a member that left its group,
// cannot go on with it. c.mu is held.
func (c *core) replaceClient(ctx context.Context, s *state, rs *Restore) (*state, error) {
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
		// within the budget (the checkpoint was refused). Its
		// connections are cut, so that it cannot act beside the new
		// client, which then ends a request it waited on; its Close is
		// waited for a moment, not for as long as the broker is gone
		// (kgo retries, an OnPartitionsRevoked waits). A member it
		// failed to remove is removed by the new client.
		s.dial.CloseAll(true)
		s.cl.AllowRebalance()
		closing := c.closing
		if closing == nil {
			closing = startClose(s)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		if waitClosed(wctx, closing) != nil {
			c.cfg.log.Info("not waiting for the kgo client that left the group to close; its connections are closed")
		}
		cancel()
	}
	c.recordedRestored.Store(0)
	cl, sess, dial, err := c.build()
	if err != nil {
		return s, err
	}
	if m := c.unleft; m != nil {
		c.unleft = nil
		rs.RemovesMember = m.memberID
		go c.removeUnleft(cl, *m)
	}
	c.gen++
	if c.marks != nil {
		c.marks.rotate()
	}
	c.startResolve(cl)
	rs.NewClient = true
	return newState(cl, sess, dial, c.gen), nil
}
