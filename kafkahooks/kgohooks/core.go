package kgohooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/internal/quiesce"
	"github.com/kcr-dev/kcr/notify"
)

var (
	// ErrOpenTxn is the error of a checkpoint refused by FailOnOpenTxn.
	ErrOpenTxn = errors.New("kgohooks: a transaction is open")
	// ErrTxnAbortedByCheckpoint is returned for calls that belong to a
	// transaction the before-checkpoint hook aborted (AbortOpenTxn).
	ErrTxnAbortedByCheckpoint = errors.New("kgohooks: the transaction was aborted by a checkpoint; begin a new one")
	// ErrNotFlushed is the error of a checkpoint refused because buffered
	// records were not all acknowledged within the hook's budget.
	ErrNotFlushed = errors.New("kgohooks: records not acknowledged within the checkpoint budget")
)

// IsFenced reports whether err is one the broker gives a transactional
// producer after another one took its transactional id: after a restore
// with KeepTxnID, the instance that initialized the id last fences the
// other. Kafka 4.1 (transactions v2) answers the fenced one with
// kerr.InvalidProducerEpoch on a produce, kerr.ProducerFenced, or
// kerr.InvalidTxnState when it ends a transaction the new holder aborted;
// kgo then refuses to begin another. A fenced client cannot commit again;
// kgohooks does not replace it, because the id now belongs to the other
// instance: stop producing and Close it.
func IsFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidTxnState)
}

// commitMode is how the group consumer commits.
type commitMode int

const (
	commitAuto   commitMode = iota // kgo's autocommit of polled records
	commitMarks                    // kgo.AutoCommitMarks
	commitManual                   // kgo.DisableAutoCommit
)

// core is what Client and GroupTransactSession share: the kgo options, the
// identity, the gate and the hooks.
type core struct {
	cfg     config
	kopts   []kgo.Opt
	session bool

	baseClientID string
	baseTxnID    string
	group        string
	commit       commitMode
	pos          *positions // direct partitions, or nil
	marks        *marks     // group consumers

	state   atomic.Pointer[state]
	calls   atomic.Int64 // Produce, commit and transaction calls inside kgo
	polls   atomic.Int64 // polls inside kgo
	blocked atomic.Int64 // callers waiting at the gate
	txnOpen atomic.Bool  // the application began a transaction and has not ended it
	// txnAborted is set when a checkpoint ended the application's open
	// transaction; cleared by the application's next End or Begin.
	txnAborted atomic.Bool
	// handedGen is the generation of the client that handed out the oldest
	// records polled since the last End (sessions): 0 if none.
	handedGen atomic.Uint64

	unregister func()
	resolving  chan struct{} // closed when the background resolution ends
	stopResolv context.CancelFunc

	mu     sync.Mutex
	gate   chan struct{}
	closed bool
	torn   bool // the before hook of this cycle closed the kgo client
	// cut is set when the before hook of this cycle closed the kgo
	// client's connections and kept the client, for a resume.
	cut      bool
	dialFn   func(context.Context, string, string) (net.Conn, error) // kgo's, from the user's options
	gen      uint64
	clientID string
	txnID    string
	bgErr    error // the last error of the background offset resolution
	reportMu sync.Mutex
	report   map[string]any
}

// state is one kgo client and whether the gate is closed in front of it.
type state struct {
	cl   *kgo.Client
	sess *kgo.GroupTransactSession
	dial *conntrack.Tracker // cl's connections
	gen  uint64
	gate chan struct{} // non-nil while the gate is closed; closed when it opens
	// txnPass lets calls of the open transaction through the closed gate,
	// so that the application can end it before the dump.
	txnPass bool
	// commitPass lets the application's commits through until the hook
	// commits on its own.
	commitPass bool
	stop       context.Context // canceled when a checkpoint begins: ends polls
	cancel     context.CancelFunc
	closed     bool
}

func newState(cl *kgo.Client, sess *kgo.GroupTransactSession, dial *conntrack.Tracker, gen uint64) *state {
	ctx, cancel := context.WithCancel(context.Background())
	return &state{cl: cl, sess: sess, dial: dial, gen: gen, stop: ctx, cancel: cancel}
}

var errNoDial = errors.New("kgohooks: option inspection does not dial")

// newCore reads the options with a kgo client that cannot dial, builds the
// first client and registers the hooks.
func newCore(kopts []kgo.Opt, session bool, opts []Option) (*core, error) {
	// The dial function first, from a client that consumes nothing (a
	// group without topics never joins) and so does not dial. kgo builds it
	// from DialTimeout and DialTLSConfig unless the user gave a Dialer; the
	// probe below cannot keep DialTLSConfig beside its own Dialer.
	dprobe, err := kgo.NewClient(append(slices.Clip(kopts), kgo.ConsumeTopics(), kgo.ConsumePartitions(nil))...)
	if err != nil {
		return nil, err
	}
	userDial, _ := dprobe.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	dprobe.Close()
	probe, err := kgo.NewClient(append(slices.Clip(kopts), kgo.DialTLSConfig(nil), kgo.Dialer(func(context.Context, string, string) (net.Conn, error) {
		return nil, errNoDial
	}))...)
	if err != nil {
		return nil, err
	}
	c := &core{cfg: newConfig(opts), kopts: slices.Clip(kopts), session: session}
	c.dialFn = userDial
	c.baseClientID, _ = probe.OptValue(kgo.ClientID).(string)
	c.baseTxnID, _ = probe.OptValue(kgo.TransactionalID).(string)
	c.group, _ = probe.OptValue(kgo.ConsumerGroup).(string)
	parts, _ := probe.OptValue(kgo.ConsumePartitions).(map[string]map[int32]kgo.Offset)
	if b, _ := probe.OptValue(kgo.DisableAutoCommit).(bool); b {
		c.commit = commitManual
	} else if b, _ := probe.OptValue(kgo.AutoCommitMarks).(bool); b {
		c.commit = commitMarks
	}
	probe.Close()
	if session && c.group == "" {
		return nil, errors.New("kgohooks: a GroupTransactSession needs kgo.ConsumerGroup")
	}
	if session && c.baseTxnID == "" {
		return nil, errors.New("kgohooks: a GroupTransactSession needs kgo.TransactionalID")
	}
	// Without a group, positions are kept even with no partitions yet:
	// AddConsumePartitions may add some, and the next client needs them.
	if c.group == "" {
		if c.pos, err = newPositions(parts); err != nil {
			return nil, err
		}
	}
	if c.group != "" {
		c.marks = newMarks()
	}
	c.clientID, c.txnID = c.baseClientID, c.baseTxnID
	if c.cfg.name == "" {
		c.cfg.name = "kgo/" + c.baseClientID
	}
	c.cfg.log = c.cfg.log.With("resource", c.cfg.name)
	cl, sess, dial, err := c.build()
	if err != nil {
		return nil, err
	}
	c.gen = 1
	c.state.Store(newState(cl, sess, dial, 1))
	c.startResolve(cl)
	c.unregister = c.cfg.registry.Register(c.cfg.name, c)
	return c, nil
}

// build creates a kgo client with the user's options and the current
// identity and positions. Called with c.mu held or before c is shared.
func (c *core) build() (*kgo.Client, *kgo.GroupTransactSession, *conntrack.Tracker, error) {
	// kgo dials through a tracker, so that a checkpoint can close the
	// client's connections without closing the client (kgo has no other
	// way). kgo refuses a Dialer beside DialTLSConfig: dialFn does the TLS.
	dial := conntrack.New(c.dialFn, nil)
	opts := append(slices.Clip(c.kopts), kgo.ClientID(c.clientID), kgo.DialTLSConfig(nil), kgo.Dialer(dial.DialContext))
	if c.txnID != "" {
		opts = append(opts, kgo.TransactionalID(c.txnID))
	}
	if c.pos != nil {
		if exact := c.pos.exact(); len(exact) > 0 {
			opts = append(opts, kgo.ConsumePartitions(exact))
		}
	}
	if c.session {
		s, err := kgo.NewGroupTransactSession(opts...)
		if err != nil {
			return nil, nil, nil, err
		}
		return s.Client(), s, dial, nil
	}
	cl, err := kgo.NewClient(opts...)
	return cl, nil, dial, err
}

// startResolve resolves symbolic start offsets of direct partitions in the
// background, as kgo would, and hands the exact ones to cl. Called with
// c.mu held or before c is shared.
func (c *core) startResolve(cl *kgo.Client) {
	if c.pos == nil || c.pos.unresolved() == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.resolving, c.stopResolv = done, cancel
	go func() {
		defer close(done)
		adm := kadm.NewClient(cl)
		for d := c.cfg.backoffMin; ; d = min(2*d, c.cfg.backoffMax) {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			exact, err := c.pos.resolve(rctx, adm)
			rcancel()
			if err == nil {
				if len(exact) > 0 {
					cl.AddConsumePartitions(exact)
				}
				c.mu.Lock()
				c.bgErr = nil
				c.mu.Unlock()
				return
			}
			c.mu.Lock()
			c.bgErr = err
			c.mu.Unlock()
			c.cfg.log.Warn("resolving start offsets of direct partitions", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
	}()
}

// Kinds of calls, for the gate.
const (
	newWork   = iota // waits at a closed gate
	txnWork          // passes while the hook waits for the open transaction
	commitReq        // passes until the hook commits itself
)

// enter counts a call and returns the state to make it on, waiting at a
// closed gate unless kind lets it pass.
func (c *core) enter(ctx context.Context, counter *atomic.Int64, kind int) (*state, error) {
	for {
		counter.Add(1)
		s := c.state.Load()
		if s.gate == nil || (kind == txnWork && s.txnPass && c.txnOpen.Load()) || (kind == commitReq && s.commitPass) {
			return s, nil
		}
		counter.Add(-1)
		if s.closed {
			return nil, kgo.ErrClientClosed
		}
		if err := quiesce.Wait(ctx, s.gate, &c.blocked); err != nil {
			return nil, err
		}
	}
}

// Produce is kgo.Client.Produce. During a checkpoint it waits at the gate
// until the process is resumed or restored (or ctx ends, then promise gets
// ctx's error); it never fails because of the checkpoint. Records of an open
// transaction pass while the hook waits for the transaction to end.
func (c *core) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	if c.baseTxnID != "" && c.txnAborted.Load() {
		fail(r, promise, ErrTxnAbortedByCheckpoint)
		return
	}
	s, err := c.enter(ctx, &c.calls, c.produceKind())
	if err != nil {
		fail(r, promise, err)
		return
	}
	s.cl.Produce(ctx, r, promise)
	c.calls.Add(-1)
}

// TryProduce is kgo.Client.TryProduce, gated like Produce.
func (c *core) TryProduce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	if c.baseTxnID != "" && c.txnAborted.Load() {
		fail(r, promise, ErrTxnAbortedByCheckpoint)
		return
	}
	s, err := c.enter(ctx, &c.calls, c.produceKind())
	if err != nil {
		fail(r, promise, err)
		return
	}
	s.cl.TryProduce(ctx, r, promise)
	c.calls.Add(-1)
}

func (c *core) produceKind() int {
	if c.baseTxnID != "" {
		return txnWork
	}
	return newWork
}

func fail(r *kgo.Record, promise func(*kgo.Record, error), err error) {
	if promise != nil {
		promise(r, err)
	}
}

// ProduceSync is kgo.Client.ProduceSync, gated like Produce. It calls kgo's
// own ProduceSync, which sends its records without waiting for the linger
// (10 ms by default): a ProduceSync built on Produce paid it every call.
func (c *core) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	failAll := func(err error) kgo.ProduceResults {
		res := make(kgo.ProduceResults, len(rs))
		for i, r := range rs {
			res[i] = kgo.ProduceResult{Record: r, Err: err}
		}
		return res
	}
	if c.baseTxnID != "" && c.txnAborted.Load() {
		return failAll(ErrTxnAbortedByCheckpoint)
	}
	s, err := c.enter(ctx, &c.calls, c.produceKind())
	if err != nil {
		return failAll(err)
	}
	// Counted until acknowledged: the checkpoint's flush waits for it.
	defer c.calls.Add(-1)
	return s.cl.ProduceSync(ctx, rs...)
}

// Flush is kgo.Client.Flush. During a checkpoint it waits at the gate
// first (the checkpoint flushes anyway), except the flush of an open
// transaction while the hook waits for the application to end it: kgo
// needs it before EndTransaction.
func (c *core) Flush(ctx context.Context) error {
	s, err := c.enter(ctx, &c.calls, c.produceKind())
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	return s.cl.Flush(ctx)
}

// PollFetches is kgo.Client.PollFetches. A poll that waits when a
// checkpoint begins ends without records and waits at the gate; a poll that
// starts during a checkpoint waits there too. It returns the records of the
// kgo client of the moment, never an error caused by the checkpoint.
func (c *core) PollFetches(ctx context.Context) kgo.Fetches { return c.PollRecords(ctx, -1) }

// PollRecords is kgo.Client.PollRecords, gated like PollFetches.
func (c *core) PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches {
	for {
		s, err := c.enter(ctx, &c.polls, newWork)
		if err != nil {
			return kgo.NewErrFetch(err)
		}
		pctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(s.stop, cancel)
		fs := s.cl.PollRecords(pctx, maxPollRecords)
		stop()
		cancel()
		interrupted := s.stop.Err() != nil && ctx.Err() == nil
		if interrupted {
			fs = dropCanceled(fs)
		}
		if n := fs.NumRecords(); n > 0 {
			c.handed(s, fs)
		}
		c.polls.Add(-1)
		if interrupted && fs.NumRecords() == 0 && len(fs.Errors()) == 0 {
			continue // the checkpoint ended this poll: wait at the gate
		}
		return fs
	}
}

// handed notes the records a poll hands to the application.
func (c *core) handed(s *state, fs kgo.Fetches) {
	if c.pos != nil {
		c.pos.handed(fs)
	}
	if c.marks != nil {
		c.marks.handed(fs)
	}
	if c.session {
		c.handedGen.CompareAndSwap(0, s.gen)
	}
}

// dropCanceled removes the context errors of a poll the checkpoint ended.
func dropCanceled(fs kgo.Fetches) kgo.Fetches {
	out := fs[:0:0]
	for _, f := range fs {
		var ts []kgo.FetchTopic
		for _, t := range f.Topics {
			var ps []kgo.FetchPartition
			for _, p := range t.Partitions {
				if p.Err != nil && errors.Is(p.Err, context.Canceled) && len(p.Records) == 0 {
					continue
				}
				ps = append(ps, p)
			}
			if len(ps) > 0 {
				t.Partitions = ps
				ts = append(ts, t)
			}
		}
		if len(ts) > 0 {
			f.Topics = ts
			out = append(out, f)
		}
	}
	return out
}

// ProducerID is kgo.Client.ProducerID of the current kgo client.
func (c *core) ProducerID(ctx context.Context) (int64, int16, error) {
	s, err := c.enter(ctx, &c.calls, newWork)
	if err != nil {
		return 0, 0, err
	}
	defer c.calls.Add(-1)
	return s.cl.ProducerID(ctx)
}

// ClientID returns the client id the current kgo client sends.
func (c *core) ClientID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clientID
}

// TransactionalID returns the transactional id of the current kgo client
// ("" if not transactional).
func (c *core) TransactionalID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.txnID
}

// Name returns the name the client is registered under.
func (c *core) Name() string { return c.cfg.name }

// Underlying returns the current kgo client, for calls the wrapper does not
// gate (admin requests through kadm, metrics). It is replaced after a
// restore, and after a resume of a group consumer that left its group: do
// not keep it.
func (c *core) Underlying() *kgo.Client { return c.state.Load().cl }

// close closes the gate for good and the kgo client.
func (c *core) close(closeInner func(*state)) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	s := c.state.Load()
	c.state.Store(&state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, closed: true, gate: make(chan struct{}), stop: s.stop, cancel: s.cancel})
	if c.gate != nil {
		close(c.gate)
		c.gate = nil
	}
	torn, cut := c.torn, c.cut
	stopResolv, resolving := c.stopResolv, c.resolving
	c.mu.Unlock()
	c.unregister()
	s.cancel()
	if cut {
		// Closed during a checkpoint, with dials held: fail them rather
		// than reconnect. Otherwise kgo closes as usual (it leaves the
		// group, ends fetch sessions).
		s.dial.CloseAll(true)
	}
	if stopResolv != nil {
		stopResolv()
		<-resolving
	}
	if !torn {
		closeInner(s)
	}
}

func (c *core) setReport(m map[string]any) {
	c.reportMu.Lock()
	c.report = m
	c.reportMu.Unlock()
}

// CheckpointReport implements notify.Reporter: what the last hook run did.
func (c *core) CheckpointReport() map[string]any {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	m := make(map[string]any, len(c.report))
	for k, v := range c.report {
		m[k] = v
	}
	return m
}

// share returns a context that ends when frac of ctx's remaining time has
// passed.
func share(ctx context.Context, frac float64) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Duration(float64(time.Until(deadline))*frac)))
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
	gated := &state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: c.gate, txnPass: true, commitPass: true, stop: s.stop, cancel: s.cancel}
	c.state.Store(gated)
	s.cancel() // ends waiting polls
	resolving, stopResolv := c.resolving, c.stopResolv
	clientID, txnID := c.clientID, c.txnID
	c.mu.Unlock()

	rep := map[string]any{"phase": "before-checkpoint", "client_id": clientID}
	if txnID != "" {
		rep["transactional_id"] = txnID
	}
	if c.group != "" {
		rep["group"] = c.group
	}
	finish := func(err error) error {
		rep["callers_blocked"] = c.blocked.Load()
		rep["duration_ms"] = time.Since(start).Milliseconds()
		if err != nil {
			rep["error"] = err.Error()
			c.cfg.log.Warn("checkpoint refused; the client goes on unchanged", "err", err)
		} else {
			c.cfg.log.Debug("kgo client quiesced", "report", rep)
		}
		c.setReport(rep)
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

	// An open transaction: let the application end it, then apply the policy.
	if c.baseTxnID != "" {
		tctx, cancel := share(ctx, 0.5)
		for c.txnOpen.Load() && tctx.Err() == nil {
			select {
			case <-tctx.Done():
			case <-time.After(time.Millisecond):
			}
		}
		cancel()
		rep["transaction"] = "none"
		if c.txnOpen.Load() {
			if c.cfg.openTxn == FailOnOpenTxn {
				rep["transaction"] = "open"
				return finish(fmt.Errorf("%w at the checkpoint and the application did not end it within half the hook budget; end it before checkpointing, or choose AbortOpenTxn or CommitOpenTxn", ErrOpenTxn))
			}
			c.mu.Lock()
			c.state.Store(&state{cl: s.cl, sess: s.sess, dial: s.dial, gen: s.gen, gate: c.gate, commitPass: true, stop: s.stop, cancel: s.cancel})
			c.mu.Unlock()
			ectx, cancel := share(ctx, 0.6)
			quiesce.WaitZero(ectx, &c.calls)
			cancel()
			rep["transaction"] = c.endOpenTxn(ctx, s)
		}
	}

	// Flush: nothing may be carried in the image under this producer id.
	fctx, cancel := share(ctx, 0.7)
	quiesce.WaitZero(fctx, &c.calls)
	buffered := s.cl.BufferedProduceRecords()
	err := s.cl.Flush(fctx)
	cancel()
	left := s.cl.BufferedProduceRecords()
	rep["records_flushed"] = max(buffered-left, 0)
	if err != nil || left > 0 {
		rep["records_unflushed"] = left
		// A carry veto (kcr exits 10), like --require-drained's for kafkahooks.
		return finish(&notify.CarryError{Records: left, Err: fmt.Errorf("%w: %d of %d buffered records still unacknowledged (%v); the checkpoint is refused so that no record is carried in the image under producer id of client %q", ErrNotFlushed, left, buffered, err, clientID)})
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
		rep["partitions_committed"], rep["commit_attempts"] = n, attempts
		if err != nil {
			return finish(fmt.Errorf("kgohooks: committing the offsets handed out before the checkpoint: %w", err))
		}
		rep["stale_commits"] = c.marks.staleCommits()
	}
	if c.pos != nil {
		if next := c.pos.report(); len(next) > 0 {
			rep["next_offsets"] = next
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
		if c.group != "" {
			rep["left_group"] = false
		}
		rep["connections_closed"] = s.dial.CloseAll(false)
		c.mu.Lock()
		c.cut = true
		c.mu.Unlock()
		rep["closed"], rep["kept_for_resume"] = false, true
		rep["connections_open"] = s.dial.Open()
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
	err = s.cl.LeaveGroupContext(lctx)
	cancel()
	rep["left_group"] = err == nil
	if err != nil {
		c.cfg.log.Warn("leaving the group before the checkpoint", "err", err)
	}
	if err := closeWithin(ctx, s); err != nil {
		rep["closed"] = false
		return finish(err)
	}
	rep["closed"] = true
	return finish(nil)
}

// closeWithin closes s's kgo client (or session), waiting until ctx ends.
func closeWithin(ctx context.Context, s *state) error {
	closed := make(chan struct{})
	go func() {
		if s.sess != nil {
			s.sess.Close()
		} else {
			s.cl.Close()
		}
		close(closed)
	}()
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
// returns what it did, for the report.
func (c *core) endOpenTxn(ctx context.Context, s *state) string {
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
		// A failed commit is retried as an abort, as kgo's documentation says.
		s.cl.AbortBufferedRecords(ctx)
		err = s.cl.EndTransaction(ctx, kgo.TryAbort)
	}
	c.txnOpen.Store(false)
	if committed {
		return "committed"
	}
	c.txnAborted.Store(true)
	if err != nil {
		c.cfg.log.Warn("aborting the open transaction before the checkpoint", "err", err)
		return "aborted (" + err.Error() + ")"
	}
	return "aborted"
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
	}
	rep := map[string]any{"phase": "after-restore", "event": ev.Kind.String(), "client_id": c.clientID}
	if c.txnID != "" {
		rep["transactional_id"] = c.txnID
	}
	s := c.state.Load()
	var err error
	switch {
	case c.cut && ev.Kind == notify.Resume:
		// The same kgo client goes on: its dials may reach the broker again.
		s.dial.Resume()
		s = newState(s.cl, s.sess, s.dial, s.gen)
		rep["new_client"] = false
	case c.torn || c.cut:
		if c.cut {
			// A restored copy must not write as the original: the old
			// client's dials fail from now on, and it is closed (a group
			// member's LeaveGroup cannot reach the broker, so it does not
			// remove the original, which may run on).
			s.dial.CloseAll(true)
			if cerr := closeWithin(ctx, s); cerr != nil {
				c.cfg.log.Warn("closing the kgo client of the image", "err", cerr)
			}
		}
		var cl *kgo.Client
		var sess *kgo.GroupTransactSession
		var dial *conntrack.Tracker
		cl, sess, dial, err = c.build()
		if err == nil {
			c.gen++
			if c.marks != nil {
				c.marks.rotate()
			}
			s = newState(cl, sess, dial, c.gen)
			c.startResolve(cl)
			rep["new_client"] = true
		}
	default:
		s = newState(s.cl, s.sess, s.dial, s.gen)
		if c.resolving != nil && c.pos.unresolved() > 0 {
			c.startResolve(s.cl)
		}
		rep["new_client"] = false
	}
	if err != nil {
		// Cannot happen with options NewClient accepted; fail calls
		// rather than leave them waiting.
		c.closed = true
		s = &state{cl: s.cl, closed: true, gate: make(chan struct{}), stop: s.stop, cancel: s.cancel}
		err = fmt.Errorf("kgohooks: new kgo client: %w", err)
	}
	c.torn, c.cut = false, false
	c.state.Store(s)
	close(c.gate)
	c.gate = nil
	rep["callers_blocked"] = c.blocked.Load()
	rep["duration_ms"] = time.Since(start).Milliseconds()
	c.setReport(rep)
	return err
}
