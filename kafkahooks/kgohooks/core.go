package kgohooks

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/internal/hookreport"
	"github.com/kcr-dev/kcr/internal/quiesce"
)

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
	sasl         bool // kgo.SASL is set: a restore checks the credentials
	group        string
	commit       commitMode
	pos          *positions      // direct partitions, or nil
	tpos         *topicPositions // direct consumer of whole topics (ConsumeTopics, ConsumeRegex), or nil
	topics       []string        // kgo.ConsumeTopics without ConsumeRegex
	marks        *marks          // group consumers
	// blockRebalance is kgo.BlockRebalanceOnPoll: a poll returned to the
	// application blocks kgo's rebalances, and so its LeaveGroup, until
	// the application calls AllowRebalance.
	blockRebalance bool
	held           atomic.Bool // a poll was returned and AllowRebalance not called since
	readCommitted  bool        // kgo.FetchIsolationLevel(kgo.ReadCommitted())
	userAdjust     adjustFn    // the user's kgo.AdjustFetchOffsetsFn, or nil
	// recordedRestored counts, since the last restore, the partitions that
	// continued from the offsets the checkpoint recorded (see groupStarts).
	recordedRestored atomic.Int64
	repMu            sync.Mutex // orders updates of the after-restore report

	// baseInstanceID is kgo.InstanceID ("" for a dynamic member); the
	// current one, instanceID (under mu), is suffixed on every restore
	// (static.go).
	baseInstanceID string
	instanceID     string
	// serverSide is kgo.ServerSideBalancer: KIP-848 if the broker has it.
	serverSide bool

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
	torn   bool // the before hook of this cycle left the group (the kgo client is replaced)
	shut   bool // ... and closed the kgo client
	// closing is closed when the kgo client the before hook began closing
	// is closed (set when the hook did not wait for it).
	closing <-chan struct{}
	// cut is set when the before hook of this cycle closed the kgo
	// client's connections and kept the client, for a resume.
	cut bool
	// unleft is the member the before hook could not remove from its
	// group (the broker was unreachable); the next client removes it.
	unleft   *groupMember
	dialFn   func(context.Context, string, string) (net.Conn, error) // kgo's, from the user's options
	gen      uint64
	clientID string
	txnID    string
	bgErr    error        // the last error of the background offset resolution
	starts   *groupStarts // the current group client's start offsets
	recorded map[tp]int64 // the group's committed offsets at the last checkpoint, for the next client
	reports  hookreport.Slot[Report]
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
	// workPass lets new work other than polls through while the hook
	// waits for the application to call AllowRebalance: it may produce
	// while it processes what it polled (kgo.BlockRebalanceOnPoll).
	workPass bool
	stop     context.Context // canceled when a checkpoint begins: ends polls
	cancel   context.CancelFunc
	closed   bool
}

func newState(cl *kgo.Client, sess *kgo.GroupTransactSession, dial *conntrack.Tracker, gen uint64) *state {
	ctx, cancel := context.WithCancel(context.Background())
	return &state{cl: cl, sess: sess, dial: dial, gen: gen, stop: ctx, cancel: cancel}
}

// Kinds of calls, for the gate.
const (
	newWork   = iota // waits at a closed gate, unless workPass
	txnWork          // passes while the hook waits for the open transaction
	commitReq        // passes until the hook commits itself
	pollWork         // always waits at a closed gate
)

// enter counts a call and returns the state to make it on, waiting at a
// closed gate unless kind lets it pass.
func (c *core) enter(ctx context.Context, counter *atomic.Int64, kind int) (*state, error) {
	for {
		counter.Add(1)
		s := c.state.Load()
		if s.gate == nil || (kind == txnWork && s.txnPass && c.txnOpen.Load()) || (kind == commitReq && s.commitPass) ||
			(kind != pollWork && kind != commitReq && s.workPass) {
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
	c.produce(ctx, r, promise, (*kgo.Client).Produce)
}

// TryProduce is kgo.Client.TryProduce, gated like Produce.
func (c *core) TryProduce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	c.produce(ctx, r, promise, (*kgo.Client).TryProduce)
}

// produce passes r through the gate to send, kgo's Produce or TryProduce.
func (c *core) produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error),
	send func(*kgo.Client, context.Context, *kgo.Record, func(*kgo.Record, error))) {
	if c.baseTxnID != "" && c.txnAborted.Load() {
		fail(r, promise, ErrTxnAbortedByCheckpoint)
		return
	}
	s, err := c.enter(ctx, &c.calls, c.produceKind())
	if err != nil {
		fail(r, promise, err)
		return
	}
	c.cfg.registry.Touch(1) // notify.Activity
	send(s.cl, ctx, r, promise)
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
	c.cfg.registry.Touch(len(rs)) // notify.Activity
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

// pollUntilStopped polls cl until ctx ends or a checkpoint cancels stop.
// interrupted says the checkpoint ended the poll (not the caller's ctx);
// its fetches are then cleared of the cancellation's errors.
func pollUntilStopped(ctx, stop context.Context, cl *kgo.Client, maxPollRecords int) (fs kgo.Fetches, interrupted bool) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	unhook := context.AfterFunc(stop, cancel)
	fs = cl.PollRecords(pctx, maxPollRecords)
	unhook()
	if interrupted = stop.Err() != nil && ctx.Err() == nil; interrupted {
		fs = dropCanceled(fs)
	}
	return fs, interrupted
}

// PollRecords is kgo.Client.PollRecords, gated like PollFetches.
func (c *core) PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches {
	for {
		s, err := c.enter(ctx, &c.polls, pollWork)
		if err != nil {
			return kgo.NewErrFetch(err)
		}
		fs, interrupted := pollUntilStopped(ctx, s.stop, s.cl, maxPollRecords)
		if c.tpos != nil && len(fs) > 0 {
			if fs = c.tpos.filter(s.cl, fs); len(fs) == 0 && !interrupted && ctx.Err() == nil {
				c.polls.Add(-1)
				continue // only records handed out before
			}
		}
		if n := fs.NumRecords(); n > 0 {
			c.handed(s, fs)
		}
		if interrupted && fs.NumRecords() == 0 && len(fs.Errors()) == 0 {
			// The checkpoint ended this poll: wait at the gate. With
			// BlockRebalanceOnPoll kgo counted it as a poll that blocks
			// rebalances; the application never sees it, so it would
			// never allow them, and the group could not be left.
			if c.blockRebalance && !c.held.Load() {
				s.cl.AllowRebalance()
			}
			c.polls.Add(-1)
			continue
		}
		if c.blockRebalance && len(fs) > 0 {
			c.held.Store(true)
		}
		c.polls.Add(-1)
		return fs
	}
}

// AllowRebalance is kgo.Client.AllowRebalance, for kgo.BlockRebalanceOnPoll:
// call it when done with what the polls returned, as kgo documents. A
// checkpoint that leaves the group waits up to half its budget for it (calls
// other than polls pass the gate meanwhile), and is refused with
// ErrRebalanceBlocked if it does not come.
func (c *core) AllowRebalance() {
	c.state.Load().cl.AllowRebalance()
	c.held.Store(false)
}

// handed notes the records a poll hands to the application.
func (c *core) handed(s *state, fs kgo.Fetches) {
	c.cfg.registry.Touch(fs.NumRecords()) // notify.Activity
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
	return keepPartitions(fs, func(_ string, p *kgo.FetchPartition) bool {
		return p.Err == nil || !errors.Is(p.Err, context.Canceled) || len(p.Records) > 0
	})
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

// CheckpointReport implements notify.Reporter: Report as a map, which lands
// in the image manifest; nil before the first hook run.
func (c *core) CheckpointReport() map[string]any { return c.reports.Map() }

// Report returns the report of the last hook run, and false before the
// first one. Its parts are shared: do not modify them.
func (c *core) Report() (Report, bool) { return c.reports.Load() }
