package kafkahooks

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/internal/quiesce"
	"github.com/kcr-dev/kcr/notify"
)

// BeforeCheckpoint implements notify.Resource; see the type's documentation.
func (r *Reader) BeforeCheckpoint(ctx context.Context) error {
	start := time.Now()
	// A hand-over still waiting for the restored member: its old members
	// stay kept, and its connections close before the dump.
	r.stopHandover()
	c, ok := r.closeGate()
	if !ok {
		return nil
	}
	dctx, cancel := drainContext(ctx)
	defer cancel()
	var diag <-chan groupDiag
	if r.group && c.member.memberID() == "" {
		// The reader will leave: will the group be empty?
		diag = r.diagnoseGroup(dctx)
	}
	q := r.quiesce(dctx, c)
	n := r.retire(dctx, c, q)
	rep, err := r.checkpointReport(dctx, c, q, n, diag)
	elapsed := time.Since(start)
	rep.DurationMS = elapsed.Milliseconds()
	r.reports.Store(rep)
	r.logCheckpoint(ctx, rep.ReaderCheckpoint, q.closed, err, elapsed)
	return err
}

// quiesceCycle is what one BeforeCheckpoint works on: the generation whose
// gate it closed.
type quiesceCycle struct {
	s       *readerState
	cycle   uint64
	inner   *kafka.Reader
	conns   *conntrack.Tracker
	fetches *fetchCut
	member  *memberLog
}

// quiesced is what closing a generation's kafka.Reader yields.
type quiesced struct {
	closed   bool // the kafka.Reader closed within the budget
	pinned   int
	err      error
	kept     string          // WithGroupHandover: the member id left in the group
	conns    int             // connections closed to keep it
	recorded map[tpKey]int64 // the group's committed offsets, for the image
	recErr   error
	// commitWait is how long the hook waited for the application's
	// commits of records it held (WithCommitWait).
	commitWait time.Duration
}

// closeGate closes the gate, so that calls from now on wait for the
// restore, and returns the generation to quiesce; false if closed already.
func (r *Reader) closeGate() (quiesceCycle, bool) {
	r.mu.Lock()
	if r.closed || r.closing != nil {
		r.mu.Unlock()
		return quiesceCycle{}, false
	}
	s := r.state.Load()
	r.closing = make(chan struct{})
	r.cycle++
	r.inCycle = true
	r.dropped.Store(0)
	r.minDropped.Store(math.MaxInt64)
	r.state.Store(&readerState{r: s.r, gate: r.closing, handed: s.handed, retired: s.retired})
	c := quiesceCycle{s: s, cycle: r.cycle, inner: s.r, conns: r.conns, fetches: r.fetches, member: r.member}
	r.mu.Unlock()
	r.releaseHold() // fetches held by a rebalance wait at the gate instead
	if r.stash != nil {
		// Says whether the hook has commits of its own to flush.
		r.cfg.log.Debug("kafka reader quiescing", "pending_commit_partitions", r.stash.size())
	}
	return c, true
}

// quiesce flushes and closes the generation's kafka.Reader within the
// budget: commits go out before it closes, as its own final commit gets a
// single attempt.
func (r *Reader) quiesce(dctx context.Context, c quiesceCycle) quiesced {
	clientID := r.ClientID()
	// The offsets are recorded through connections of their own, closed
	// below whatever happens, and not counted as the Reader's.
	recConns := conntrack.New(r.dialFunc(), nil)
	defer recConns.CloseAll(true)
	done := make(chan quiesced, 1)
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		if r.group {
			done <- r.quiesceGroup(dctx, c, recConns, clientID)
			return
		}
		r.closeInner(c)
		done <- quiesced{}
	}()
	select {
	case q := <-done:
		q.closed = true
		return q
	case <-dctx.Done():
		q := quiesced{recErr: context.Cause(dctx)}
		if r.group {
			q.err = fmt.Errorf("%w: the budget ran out", ErrCommitsNotFlushed)
			if r.stash == nil && r.rcfg.StartOffset != kafka.LastOffset {
				q.err = nil // nothing of ours was pending
			}
		}
		return q
	}
}

// quiesceGroup flushes a group reader's commits, keeps its member with
// WithGroupHandover, and closes it while recording the committed offsets.
func (r *Reader) quiesceGroup(dctx context.Context, c quiesceCycle, recConns *conntrack.Tracker, clientID string) quiesced {
	var q quiesced
	quiesce.WaitZero(dctx, &r.committing)
	if r.stash != nil {
		q.err = r.flushRetry(dctx, c.s)
	}
	if q.err == nil {
		q.err = r.flushWaiting(dctx, c)
	}
	if q.err == nil {
		q.commitWait, q.err = r.awaitCommits(dctx, c)
	}
	if q.err == nil && r.rcfg.StartOffset == kafka.LastOffset {
		q.pinned, q.err = r.pinTail(dctx, c.s)
	}
	if id := c.member.memberID(); id != "" && q.err == nil {
		// Cut first: kafka-go's Close cannot send its LeaveGroup, and the
		// member stays in the group.
		q.conns = c.conns.CloseAll(true)
		q.kept = id
	}
	// Recorded while the kafka.Reader closes: it commits nothing more
	// (its commits are synchronous).
	rec := make(chan struct{})
	go func() {
		defer close(rec)
		q.recorded, q.recErr = r.recordCommitted(dctx, recConns.DialContext, clientID)
	}()
	r.closeInner(c)
	<-rec
	return q
}

// beforeFlushWaiting lets a test put a commit at the gate before
// flushWaiting reads the commits waiting there.
var beforeFlushWaiting = func(*Reader) {}

// flushWaiting commits, through the generation's kafka.Reader before it
// closes, what the CommitMessages calls waiting at the gate commit: the
// application processed those records. Held until after the restore or
// resume, their commit came too late: the next generation fetches from
// the group's commit, so the records were processed again (the soak saw
// one such record every 40 or so cycles: fetched as the checkpoint began,
// committed a few ms later). The calls themselves then find their
// records committed and return nil after the gate opens.
func (r *Reader) flushWaiting(ctx context.Context, c quiesceCycle) error {
	beforeFlushWaiting(r)
	r.mu.Lock()
	msgs := make([]kafka.Message, 0, len(r.waiting))
	for k, o := range r.waiting {
		msgs = append(msgs, kafka.Message{Topic: k.topic, Partition: k.partition, Offset: o})
	}
	r.mu.Unlock()
	keep := c.s.handed.uncommitted(c.s.handed.current(msgs))
	if len(keep) == 0 {
		return nil
	}
	if err := c.inner.CommitMessages(ctx, keep...); err != nil {
		return fmt.Errorf("%w: the commits waiting at the gate: %v", ErrCommitsNotFlushed, err)
	}
	c.s.handed.committed(keep)
	return nil
}

// awaitCommits waits, up to WithCommitWait, for the application to commit
// the records it was handed and holds (handedTable.inApp), flushing each
// commit that reaches the gate, and returns how long it waited. Such
// records were fetched just before the gate closed: their commits come a
// moment after flushWaiting looked. Sent after the restore instead, they
// would come too late (see flushWaiting); the soak saw this once in about
// 150 clean cycles.
func (r *Reader) awaitCommits(ctx context.Context, c quiesceCycle) (time.Duration, error) {
	if r.cfg.commitWait <= 0 {
		return 0, nil
	}
	start := time.Now()
	t := time.NewTimer(r.cfg.commitWait)
	defer t.Stop()
	for {
		r.mu.Lock()
		n := c.s.handed.inApp(r.waiting)
		if n > 0 && r.waitingCh == nil {
			r.waitingCh = make(chan struct{})
		}
		ch := r.waitingCh
		r.mu.Unlock()
		if n == 0 {
			return time.Since(start), nil
		}
		select {
		case <-ch:
		case <-t.C:
			r.cfg.log.Debug("kafka reader: the application did not commit the records it holds before the checkpoint; they are delivered again after it", "records", n, "waited", r.cfg.commitWait)
			return time.Since(start), nil
		case <-ctx.Done():
			return time.Since(start), nil
		}
		if err := r.flushWaiting(ctx, c); err != nil {
			return time.Since(start), err
		}
	}
}

// closeInner closes the generation's kafka.Reader without waiting out the
// fetch it has in flight (up to MaxWait): that fetch is cut, and what it
// would bring is fetched again after the restore.
func (r *Reader) closeInner(c quiesceCycle) {
	c.fetches.cutFetches()
	c.inner.Close()
}

// retire ends the generation: calls still inside kafka-go are canceled,
// fetches note their drops, and its connections close. It returns how many
// were open.
func (r *Reader) retire(dctx context.Context, c quiesceCycle, q quiesced) int {
	c.s.retired.cancel()
	// Fetches that were inside kafka-go note their drops before the
	// offsets are read.
	quiesce.WaitZero(dctx, &r.fetching)
	return c.conns.CloseAll(true) + q.conns
}

// checkpointReport builds the hook's report and error, and keeps what the
// restore needs (kept members, recorded offsets, the partition's offset).
func (r *Reader) checkpointReport(dctx context.Context, c quiesceCycle, q quiesced, conns int, diag <-chan groupDiag) (ReaderReport, error) {
	st := r.absorb(c.inner)
	rc := &ReaderCheckpoint{
		Group:             r.rcfg.GroupID,
		ClosedCleanly:     q.closed,
		PrefetchedDropped: st.QueueLength + r.dropped.Load(),
		ConnectionsClosed: conns,
	}
	rep := ReaderReport{Phase: "before-checkpoint", ClientID: r.ClientID(), CallersBlocked: r.blocked.Load(), ReaderCheckpoint: rc}
	var err error
	if r.group {
		var read bool
		read, err = r.groupReport(c, q, rc, diag)
		if read {
			diag = nil
		}
	} else {
		next := r.partitionNext(dctx, c)
		rep.NextOffset = &next
	}
	if diag != nil {
		<-diag // its connections are closed
	}
	return rep, err
}

// groupReport fills in a group reader's part of the report, keeps its
// member and recorded offsets for the restore, and returns the hook's
// error (commits not flushed), and whether it read diag.
func (r *Reader) groupReport(c quiesceCycle, q quiesced, rc *ReaderCheckpoint, diag <-chan groupDiag) (bool, error) {
	gc := &GroupCheckpoint{
		LeftGroup:             q.closed && q.kept == "",
		StaleCommits:          r.staleCommits.Load(),
		StartOffsetsCommitted: q.pinned,
		MemberKept:            q.kept,
		CommitWaitMS:          q.commitWait.Milliseconds(),
	}
	rc.GroupCheckpoint = gc
	if q.kept != "" {
		gc.SessionTimeoutMS = r.sessionTimeout().Milliseconds()
		r.mu.Lock()
		r.kept = append(r.kept, q.kept)
		r.mu.Unlock()
	}
	read := false
	if q.kept == "" && gc.LeftGroup && diag != nil {
		r.warnEmptyGroup(gc, <-diag)
		read = true
		if gc.Warning != "" {
			r.cfg.log.Warn("kafka reader: " + gc.Warning)
		}
	}
	var err error
	if q.err != nil {
		rc.CommitError = q.err.Error()
		if !r.cfg.unflushedOK {
			err = q.err
		}
	}
	rc.OffsetsRecorded = len(q.recorded)
	if q.recErr != nil {
		rc.OffsetsRecordError = q.recErr.Error()
		r.cfg.log.Warn("kafka reader could not record the group's committed offsets in the image; if they expire before the restore, it starts from StartOffset", "err", q.recErr)
	}
	r.mu.Lock()
	rc.RecordsInApp = c.s.handed.inApp(r.waiting)
	if r.inCycle && r.cycle == c.cycle {
		r.recorded, r.recordedAt = q.recorded, time.Now().Round(0)
	}
	r.mu.Unlock()
	return read, err
}

// partitionNext returns the offset a partition reader continues from after
// the restore: the next record the application would have received.
func (r *Reader) partitionNext(dctx context.Context, c quiesceCycle) int64 {
	next := c.inner.Offset()
	if c.s.tail {
		// Still at a LastOffset that nothing resolved yet.
		next = kafka.LastOffset
		if off, rerr := r.lastOffset(dctx); rerr == nil {
			next = off
		} else {
			r.cfg.log.Warn("kafka reader could not resolve LastOffset before the checkpoint; it resolves again after it", "err", rerr)
		}
	}
	if md := r.minDropped.Load(); md < next || (next < 0 && md != math.MaxInt64) {
		next = md
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.nextSet && r.inCycle && r.cycle == c.cycle {
		r.next = next
	}
	return r.next
}

// logCheckpoint logs how the hook ended.
func (r *Reader) logCheckpoint(ctx context.Context, rc *ReaderCheckpoint, closed bool, err error, elapsed time.Duration) {
	switch {
	case err != nil:
		r.cfg.log.Warn("kafka reader could not flush its commits before the checkpoint; the checkpoint fails", "err", err, "duration", elapsed)
	case closed:
		r.cfg.log.Debug("kafka reader quiesced", "prefetched_dropped", rc.PrefetchedDropped, "duration", elapsed)
	default:
		r.cfg.log.Warn("kafka reader did not close within the checkpoint budget; connections closed without leaving the group or flushing commits (records will be redelivered)",
			"duration", elapsed, "cause", context.Cause(ctx))
	}
}

// offsetCheckTimeout bounds the after-restore check of the committed
// offsets, so that a broker that cannot be reached does not hold the gate
// for the whole budget.
const offsetCheckTimeout = 5 * time.Second

// AfterRestore implements notify.Resource; see the type's documentation.
func (r *Reader) AfterRestore(ctx context.Context, ev notify.Event) error {
	start := time.Now()
	r.mu.Lock()
	if r.closed || r.closing == nil {
		r.mu.Unlock()
		return nil
	}
	r.renewClientID(ev)
	var recorded map[tpKey]int64
	if r.group && ev.Kind == notify.Restore && time.Now().Round(0).Sub(r.recordedAt) >= r.cfg.offsetsCheckAfter {
		recorded = r.recorded
	}
	clientID := r.currentClientID()
	r.mu.Unlock()
	var gr *GroupRestore
	if len(recorded) > 0 {
		// Before the rejoin: a simple commit needs an empty group.
		dctx, cancel := drainContext(ctx)
		dctx, cancel2 := context.WithTimeout(dctx, offsetCheckTimeout)
		gr = r.restoreCommitted(dctx, recorded, clientID)
		cancel2()
		cancel()
		if len(gr.OffsetsRestored) > 0 {
			r.cfg.log.Warn("kafka reader found the group's committed offsets gone after the restore (offsets.retention.minutes, or deleted); committed again the positions recorded in the image",
				"group", r.rcfg.GroupID, "offsets", gr.OffsetsRestored, "err", gr.OffsetsCheckError)
		} else if gr.OffsetsCheckError != "" {
			r.cfg.log.Warn("kafka reader could not check the group's committed offsets after the restore; if they expired it starts from StartOffset", "group", r.rcfg.GroupID, "err", gr.OffsetsCheckError)
		}
	}
	r.mu.Lock()
	if r.closed || r.closing == nil {
		r.mu.Unlock()
		return nil
	}
	inner := r.newInner()
	r.inCycle = false
	r.state.Store(&readerState{r: inner, handed: r.state.Load().handed.next(), retired: newRetired(),
		tail: !r.group && r.next == kafka.LastOffset})
	close(r.closing)
	r.closing = nil
	if len(r.kept) > 0 {
		old := r.kept
		r.kept = nil
		r.startHandover(old)
	}
	rep := ReaderReport{
		Phase:          "after-restore",
		Event:          ev.Kind.String(),
		ClientID:       r.currentClientID(),
		CallersBlocked: r.blocked.Load(),
	}
	if !r.group {
		next := r.next
		rep.NextOffset = &next
	}
	rep.GroupRestore = gr
	r.nextSet = false
	r.mu.Unlock()
	rep.DurationMS = time.Since(start).Milliseconds()
	r.reports.Store(rep)
	if ev.Kind != notify.Restore {
		return nil
	}
	d := r.baseDialer
	return checkAuth(ctx, strings.Join(r.rcfg.Brokers, ","), d.DialFunc, d.TLS, d.SASLMechanism, clientID)
}

// CheckpointReport implements notify.Reporter: Report as a map, which lands
// in the image manifest; nil before the first hook run.
func (r *Reader) CheckpointReport() map[string]any { return r.reports.Map() }

// Report returns the report of the last hook run, and false before the
// first one. Its parts are shared: do not modify them.
func (r *Reader) Report() (ReaderReport, bool) { return r.reports.Load() }
