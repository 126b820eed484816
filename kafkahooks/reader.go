package kafkahooks

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/conntrack"
)

// ErrConnsClosed is returned by dials of a Reader's or Writer's retired
// Kafka client generation: its connections were closed for a checkpoint.
var ErrConnsClosed = conntrack.ErrClosed

// Reader is a kafka.Reader that takes part in kcr checkpoints. It has the
// methods of kafka.Reader and behaves the same outside checkpoints; it owns
// one kafka.Reader per checkpoint cycle, each with a kafka.Dialer whose
// connections the Reader tracks.
//
// # Before a checkpoint
//
// The Reader closes its gate: FetchMessage, ReadMessage and CommitMessages
// calls that start from then on block until the process is resumed or
// restored, or until their own ctx ends. They never fail because a
// checkpoint happened.
//
// A group Reader first sends the commits in flight or waiting at the gate,
// and waits up to WithCommitWait for the commits of records the
// application was handed just before the gate closed.
//
// It then closes the kafka.Reader, without waiting out the fetch kafka-go
// has in flight (up to MaxWait, 10 s by default): the connections that
// carry fetches are closed, the group coordinator's stays. Fetch calls in
// progress return and wait at the gate too; a record such a call received while the gate was closing
// is not handed to the application. For a consumer group, kafka-go's Close
// flushes pending commits (also the batches of a CommitInterval) and leaves
// the group, so that the other members take over its partitions at once
// (kafka-go sends LeaveGroup from ConsumerGroup.Close). A group left empty
// makes the restored member wait for the broker's
// group.initial.rebalance.delay.ms (3 s by default): the report then says so
// (warning), and WithGroupHandover keeps the membership instead. If the Close does not
// end within the hook's budget (less a reserve for later hooks, as for
// Writer), the Reader closes every connection anyway.
// Records that were prefetched but never handed to the application are
// dropped and counted in CheckpointReport: they are fetched again from the
// committed offset.
//
// # After a restore or resume
//
// A new kafka.Reader is created and the gate opens. On Restore its Dialer's
// ClientID is the base id + "-" + the first 8 hex digits of
// Event.InstanceID; on Resume it is unchanged. A group reader joins the group
// as a new member and continues from the committed offsets. A partition
// reader (no GroupID) continues at exactly the offset of the next record the
// application would have received.
//
// # Delivery
//
// For groups, records handed to the application but not committed before the
// checkpoint may be delivered again (at-least-once); committed ones are not,
// because the Reader never moves a committed offset back across a
// checkpoint: after one, a CommitMessages for a record that may have been
// fetched before it (its partition was handed out up to its offset) is
// dropped unless the new kafka.Reader handed that partition out from at most
// that offset and has not committed beyond it. A dropped commit returns nil
// and is counted (stale_commits in the report, a running total); its record
// is, or was, delivered again. Until the first checkpoint, commits pass
// unchanged.
//
// # Rebalances
//
// When a group Reader's generation ends (a member joined or left, the
// partitions changed), FetchMessage hands out nothing more until the next
// generation has started, and the Reader waits, up to WithCommitWait and
// at most half the RebalanceTimeout, for the application to commit the
// records it holds before kafka-go rejoins: those commits still go out
// with the ending generation, so that the partitions' next owners (this
// member or others) start after them and do not process them again. Alone,
// kafka-go would send them with the next generation, after the new owner
// had read the older offset, and would hand out during the rejoin the
// records it had prefetched for the ending generation. Records the
// application does not commit within the wait may still be processed
// again by the next owner; a FetchMessage call already waiting inside
// kafka-go when the generation ends may still return one such record.
// The rebalance waits for the records of one batch at most (the other
// members wait for this one to rejoin); an application that holds records
// uncommitted while it fetches more pays the whole wait.
//
// # Cost
//
// Outside checkpoints FetchMessage costs three atomic loads more than
// kafka.Reader.FetchMessage, plus, for group readers, one lookup in a small
// read-only map (the partitions handed out since the last checkpoint) and an
// atomic store. A group Reader always gives kafka-go a Logger (to see its
// generations end and start), so kafka-go formats its log lines, among
// them one per commit, also when the ReaderConfig has no Logger.
type Reader struct {
	cfg        config
	rcfg       kafka.ReaderConfig
	baseDialer kafka.Dialer
	group      bool

	gate[readerState, *readerState, ReaderReport]
	dropped      atomic.Int64 // records received from kafka-go but not handed out, this cycle
	minDropped   atomic.Int64 // partition readers: lowest offset dropped this cycle
	staleCommits atomic.Int64
	fetching     atomic.Int64  // FetchMessage calls inside kafka-go
	committing   atomic.Int64  // CommitMessages calls inside kafka-go
	stash        *commitStash  // with a CommitInterval: commits not sent yet
	quit         chan struct{} // closed by Close
	userInterval time.Duration // ReaderConfig.CommitInterval as given

	unregister func()
	bg         sync.WaitGroup

	mu      sync.Mutex
	closing chan struct{} // non-nil while the gate is closed
	closed  bool
	conns   *conntrack.Tracker // the current kafka.Reader's connections
	fetches *fetchCut          // the current kafka.Reader's fetch connections
	next    int64              // partition readers: where the next kafka.Reader starts
	nextSet bool               // next was set by SetOffset during this checkpoint
	cycle   uint64             // counts BeforeCheckpoint calls
	// recorded holds, for a group reader, the group's committed offsets
	// at the last checkpoint (see restoreCommitted).
	// waiting holds, per partition, the highest offset of the
	// CommitMessages calls that met the gate closed: records the
	// application has processed (see handedTable.inApp).
	waiting    map[tpKey]int64
	waitingRef map[tpKey]int
	waitingCh  chan struct{} // closed when a commit is noted waiting
	recorded   map[tpKey]int64
	recordedAt time.Time // wall clock: a restore's monotonic clock does not count the downtime

	inCycle bool
	acc     kafka.ReaderStats

	// WithGroupHandover (group.go)
	member    *memberLog    // the current kafka.Reader's; nil without the option
	kept      []string      // member ids kept in the group across a checkpoint
	hoStop    func()        // ends the hand-over in progress
	hoDone    chan struct{} // closed when it has ended
	handovers atomic.Pointer[HandoverResult]
	delayMS   atomic.Int64 // the coordinator's group.initial.rebalance.delay.ms; -1 until read

	// rebalances (rebalance.go)
	hold       atomic.Pointer[rebalanceHold]   // non-nil while a rebalance holds fetches
	holdBase   atomic.Pointer[map[tpKey]int64] // handedTable.settled at the last generation's start
	holds      atomic.Int64                    // rebalances held
	holdMissed atomic.Int64                    // records not committed within a hold's wait
}

type readerState struct {
	r      *kafka.Reader // current kafka.Reader; while the gate is closed, the closed one
	gate   chan struct{} // non-nil while the gate is closed
	closed bool
	handed *handedTable // group readers: partitions handed out since the last cycle
	// tail is set while a partition reader's position is LastOffset and
	// not resolved yet: the next FetchMessage (or checkpoint) resolves it
	// to a concrete offset first, so that a checkpoint never hands kafka-go
	// a LastOffset to resolve again, later, to a later end.
	tail bool
	// retired is closed when this generation's kafka.Reader is closed: it
	// cancels calls that reached kafka-go too late to be answered.
	retired *retiredCtx
}

func (s *readerState) blocking() (chan struct{}, bool) { return s.gate, s.closed }

// retiredCtx is a context canceled when a generation is retired.
type retiredCtx struct {
	context.Context
	cancel context.CancelFunc
}

func newRetired() *retiredCtx {
	ctx, cancel := context.WithCancel(context.Background())
	return &retiredCtx{ctx, cancel}
}

// NewReader returns a Reader configured like kafka.NewReader(c), registered
// with the registry (WithRegistry, default notify.Default) under a name
// (WithName). Like kafka.NewReader it panics if c is invalid.
//
// c.Dialer (default kafka.DefaultDialer) is copied for every kafka.Reader
// the Reader creates, with a DialFunc that tracks connections (wrapping
// c.Dialer.DialFunc if set) and the current client id.
//
// Changing
//
//	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "g", Topic: "events"})
//
// to
//
//	r := kafkahooks.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "g", Topic: "events"})
//
// is all a service needs.
func NewReader(c kafka.ReaderConfig, opts ...ReaderOpt) *Reader {
	name := "kafka-reader/"
	switch {
	case c.GroupID != "":
		name += c.GroupID
	default:
		name += c.Topic + "/" + strconv.Itoa(c.Partition)
	}
	cfg := newConfig(name, opts, ReaderOpt.applyReader)
	r := &Reader{cfg: cfg, rcfg: c, group: c.GroupID != "", next: kafka.FirstOffset, quit: make(chan struct{})}
	interval := c.CommitInterval
	r.userInterval = interval
	if r.group && interval > 0 {
		// Batched here, not by kafka-go: see commitStash.
		r.stash = &commitStash{}
		r.rcfg.CommitInterval = 0
	}
	if c.Dialer != nil {
		r.baseDialer = *c.Dialer
	} else {
		r.baseDialer = *kafka.DefaultDialer
	}
	r.setBaseClientID(cfg.clientID, r.baseDialer.ClientID)
	r.minDropped.Store(math.MaxInt64)
	r.delayMS.Store(-1)
	r.state.Store(&readerState{r: r.newInner(), handed: newHandedTable(nil), retired: newRetired()})
	r.unregister = cfg.registry.Register(cfg.name, r)
	if r.stash != nil {
		r.bg.Add(1)
		go r.intervalLoop(interval)
	}
	return r
}

// newInner creates a kafka.Reader with a fresh Dialer. Called with r.mu held
// (or before r is shared).
func (r *Reader) newInner() *kafka.Reader {
	d := r.baseDialer
	r.fetches = newFetchCut()
	r.conns = conntrack.New(r.fetches.wrap(r.dialFunc(), d.TLS), nil)
	d.TLS = nil // the handshake is fetches.wrap's
	d.DialFunc = r.conns.DialContext
	d.ClientID = r.currentClientID()
	c := r.rcfg
	c.Dialer = &d
	if r.group && r.cfg.handover {
		r.member = &memberLog{next: c.Logger}
		c.Logger = r.member
	}
	var gl *groupLog
	if r.group {
		gl = &groupLog{r: r, next: c.Logger}
		c.Logger = gl
		r.holdBase.Store(nil)
	}
	inner := kafka.NewReader(c)
	if gl != nil {
		gl.inner.Store(inner)
	}
	if !r.group && r.next != kafka.FirstOffset && r.next != kafka.LastOffset {
		inner.SetOffset(r.next)
	}
	return inner
}

// resolveTail turns a pending LastOffset into the partition's end offset,
// sets the kafka.Reader there, and publishes the state without tail.
func (r *Reader) resolveTail(ctx context.Context, s *readerState) error {
	off, err := r.lastOffset(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state.Load() != s {
		return nil // a checkpoint, Close or SetOffset came first
	}
	if err := s.r.SetOffset(off); err != nil {
		return err
	}
	r.state.Store(&readerState{r: s.r, handed: s.handed, retired: s.retired})
	return nil
}

// lastOffset asks the partition's leader for its end offset.
func (r *Reader) lastOffset(ctx context.Context) (int64, error) {
	d := r.baseDialer
	var errs error
	for _, b := range r.rcfg.Brokers {
		conn, err := d.DialLeader(ctx, "tcp", b, r.rcfg.Topic, r.rcfg.Partition)
		if err != nil {
			errs = err
			continue
		}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)
		}
		off, err := conn.ReadLastOffset()
		stop()
		conn.Close()
		if err == nil {
			return off, nil
		}
		errs = err
	}
	return 0, fmt.Errorf("resolving LastOffset of %s/%d: %w", r.rcfg.Topic, r.rcfg.Partition, errs)
}

// FetchMessage is kafka.Reader.FetchMessage. During a checkpoint it waits
// until the process is resumed or restored, or until ctx ends. After Close it
// returns io.EOF.
func (r *Reader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	if err := r.waitHold(ctx); err != nil {
		return kafka.Message{}, err
	}
	return gatedCall(ctx, &r.gate, io.EOF, func(s *readerState) (kafka.Message, bool, error) {
		if s.tail {
			err := r.resolveTail(ctx, s)
			return kafka.Message{}, err == nil, err
		}
		r.fetching.Add(1)
		defer r.fetching.Add(-1)
		m, err := s.r.FetchMessage(ctx)
		if err == nil && r.group {
			// Noted before the check below, so that a checkpoint
			// beginning right after it still sees this record.
			s.handed.note(m.Topic, m.Partition, m.Offset)
		}
		if r.state.Load() != s {
			// A checkpoint (or Close) began meanwhile: this record is
			// not handed out; it is fetched again later.
			if err == nil {
				r.drop(m.Offset)
				if r.group {
					s.handed.drop(m.Topic, m.Partition, m.Offset)
					r.pokeWaiters()
				}
			}
			return kafka.Message{}, true, nil
		}
		if err == nil {
			r.cfg.registry.Touch(1) // notify.Activity
		}
		return m, false, err
	})
}

func (r *Reader) drop(offset int64) {
	r.dropped.Add(1)
	if r.group {
		return
	}
	for {
		cur := r.minDropped.Load()
		if offset >= cur || r.minDropped.CompareAndSwap(cur, offset) {
			return
		}
	}
}

// ReadMessage is kafka.Reader.ReadMessage: FetchMessage, then, for a group,
// CommitMessages.
func (r *Reader) ReadMessage(ctx context.Context) (kafka.Message, error) {
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return kafka.Message{}, fmt.Errorf("fetching message: %w", err)
	}
	if r.group {
		if err := r.CommitMessages(ctx, m); err != nil {
			return kafka.Message{}, fmt.Errorf("committing message: %w", err)
		}
	}
	return m, nil
}

// CommitMessages is kafka.Reader.CommitMessages. During a checkpoint it waits
// until the process is resumed or restored, or until ctx ends. Commits of
// records fetched before a checkpoint that would not move their partition's
// offset forward are dropped; see the type's documentation.
func (r *Reader) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	if !r.group {
		return r.state.Load().r.CommitMessages(ctx, msgs...) // kafka-go's error
	}
	// A call that waits at the gate is noted there (only calls that meet a
	// checkpoint pay for it): the hook commits its records before the
	// kafka.Reader leaves (flushWaiting).
	noted := false
	defer func() {
		if noted {
			r.noteWaiting(msgs, -1)
		}
	}()
	atGate := func() {
		if !noted && len(msgs) > 0 {
			noted = true
			r.noteWaiting(msgs, 1)
		}
	}
	_, err := gatedCallAt(ctx, &r.gate, io.ErrClosedPipe, atGate, func(s *readerState) (struct{}, bool, error) {
		again, err := r.commitOnce(ctx, s, msgs)
		return struct{}{}, again, err
	})
	return err
}

// commitOnce commits msgs through the generation of s; again says that a
// checkpoint began under it and the call is decided afresh after it.
func (r *Reader) commitOnce(ctx context.Context, s *readerState, msgs []kafka.Message) (again bool, err error) {
	keep := s.handed.current(msgs)
	r.cfg.registry.Touch(len(keep)) // notify.Activity
	if n := len(msgs) - len(keep); n > 0 {
		r.staleCommits.Add(int64(n))
		r.cfg.log.Debug("dropped commits of records fetched before a checkpoint", "records", n)
	}
	if len(keep) == 0 {
		return false, nil
	}
	if r.stash != nil {
		r.stash.add(keep) // sent by intervalLoop or the checkpoint
		return false, nil
	}
	r.committing.Add(1)
	if r.state.Load() != s {
		r.committing.Add(-1)
		return true, nil
	}
	// A call that reaches kafka-go after its final commit would wait
	// for an answer forever: retiring the generation cancels it.
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.retired, cancel)
	err = s.r.CommitMessages(cctx, keep...)
	stop()
	cancel()
	r.committing.Add(-1)
	if err != nil && r.state.Load() != s && ctx.Err() == nil {
		return true, nil // closed for a checkpoint
	}
	if err == nil {
		s.handed.committed(keep)
	}
	return false, err
}

// noteWaiting adds (d 1) or removes (d -1) msgs as commits waiting at the
// gate.
func (r *Reader) noteWaiting(msgs []kafka.Message, d int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting, r.waitingRef = map[tpKey]int64{}, map[tpKey]int{}
	}
	for i := range msgs {
		k := tpKey{msgs[i].Topic, msgs[i].Partition}
		r.waitingRef[k] += d
		switch {
		case r.waitingRef[k] <= 0:
			delete(r.waitingRef, k)
			delete(r.waiting, k)
		case d > 0:
			if w, ok := r.waiting[k]; !ok || msgs[i].Offset > w {
				r.waiting[k] = msgs[i].Offset
			}
		}
	}
	if d > 0 {
		r.pokeLocked()
	}
}

// pokeWaiters tells awaitCommits to look at the records in the
// application's hands again.
func (r *Reader) pokeWaiters() {
	r.mu.Lock()
	r.pokeLocked()
	r.mu.Unlock()
}

func (r *Reader) pokeLocked() {
	if r.waitingCh != nil {
		close(r.waitingCh)
		r.waitingCh = nil
	}
}

// Config returns the configuration of the current kafka.Reader: the one
// given to NewReader, with kafka-go's defaults and the Reader's Dialer.
func (r *Reader) Config() kafka.ReaderConfig {
	c := r.state.Load().r.Config()
	c.CommitInterval = r.userInterval
	return c
}

// Lag is kafka.Reader.Lag.
func (r *Reader) Lag() int64 { return r.state.Load().r.Lag() }

// Offset is kafka.Reader.Offset: -1 for a group reader, else the offset of
// the next record FetchMessage returns.
func (r *Reader) Offset() int64 {
	if r.group {
		return -1
	}
	r.mu.Lock()
	s := r.state.Load()
	if s.gate != nil {
		defer r.mu.Unlock()
		return r.next
	}
	r.mu.Unlock()
	if s.tail {
		return kafka.LastOffset
	}
	return s.r.Offset()
}

// SetOffset is kafka.Reader.SetOffset. During a checkpoint it sets the
// offset the reader continues from after it.
func (r *Reader) SetOffset(offset int64) error {
	if r.group {
		return r.state.Load().r.SetOffset(offset) // kafka-go's error
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.state.Load()
	switch {
	case s.closed:
		return io.ErrClosedPipe
	case s.gate != nil:
		r.next, r.nextSet = offset, true
		return nil
	case offset == kafka.LastOffset:
		// Resolved by the next FetchMessage, or by a checkpoint.
		if !s.tail {
			r.state.Store(&readerState{r: s.r, handed: s.handed, retired: s.retired, tail: true})
		}
		return nil
	}
	if s.tail {
		r.state.Store(&readerState{r: s.r, handed: s.handed, retired: s.retired})
	}
	return s.r.SetOffset(offset)
}

// SetOffsetAt is kafka.Reader.SetOffsetAt. During a checkpoint it waits
// until the process is resumed or restored, or until ctx ends.
func (r *Reader) SetOffsetAt(ctx context.Context, t time.Time) error {
	_, err := gatedCall(ctx, &r.gate, io.ErrClosedPipe, func(s *readerState) (struct{}, bool, error) {
		err := s.r.SetOffsetAt(ctx, t)
		return struct{}{}, err != nil && r.state.Load() != s, err
	})
	return err
}

// ReadLag is kafka.Reader.ReadLag. During a checkpoint it waits until the
// process is resumed or restored, or until ctx ends.
func (r *Reader) ReadLag(ctx context.Context) (int64, error) {
	return gatedCall(ctx, &r.gate, io.ErrClosedPipe, func(s *readerState) (int64, bool, error) {
		lag, err := s.r.ReadLag(ctx)
		return lag, err != nil && r.state.Load() != s, err
	})
}

// Stats returns the kafka.Reader statistics since the last call, summed over
// the kafka.Reader values the Reader used in that time.
func (r *Reader) Stats() kafka.ReaderStats {
	r.mu.Lock()
	acc := r.acc
	r.acc = kafka.ReaderStats{}
	r.mu.Unlock()
	st := r.state.Load().r.Stats()
	addStats(&st, acc)
	return st
}

// ClientID returns the client id of the current kafka.Reader's Dialer.
func (r *Reader) ClientID() string {
	return r.currentClientID()
}

// Name returns the name the Reader is registered under.
func (r *Reader) Name() string { return r.cfg.name }

// Close is kafka.Reader.Close (a group reader commits what is pending and
// leaves the group), without waiting out a fetch in flight. It also unregisters the Reader and closes all its
// connections; blocked calls return io.EOF (FetchMessage) or
// io.ErrClosedPipe.
func (r *Reader) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	s := r.state.Load()
	r.state.Store(&readerState{r: s.r, closed: true, handed: s.handed, retired: s.retired})
	if r.closing != nil {
		close(r.closing)
		r.closing = nil
	}
	conns, fetches := r.conns, r.fetches
	r.mu.Unlock()
	r.releaseHold()
	r.unregister()
	close(r.quit)
	r.stopHandover()

	var err error
	if s.gate == nil {
		if r.stash != nil {
			// kafka-go's Close would commit them once; retry for a while.
			ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
			err = r.flushRetry(ctx, s)
			cancel()
		}
		// Nothing it fetches is handed out any more: its fetch in
		// flight is cut rather than waited out.
		fetches.cutFetches()
		if e := s.r.Close(); err == nil {
			err = e
		}
		s.retired.cancel()
		r.absorb(s.r)
	}
	r.bg.Wait()
	conns.CloseAll(true)
	r.leaveKept()
	return err
}

// leaveKept removes the members kept across a checkpoint that are still in
// the group, as kafka-go's Close does for its own (best effort).
func (r *Reader) leaveKept() {
	r.mu.Lock()
	kept := r.kept
	r.kept = nil
	r.mu.Unlock()
	if len(kept) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), diagnoseTimeout)
	defer cancel()
	cl, done := r.adminClient()
	defer done()
	if err := r.leave(ctx, cl, kept); err != nil {
		r.cfg.log.Warn("kafka reader could not remove the members it kept across a checkpoint; they leave when their session expires", "err", err)
	}
}

// closeFlushTimeout bounds how long Close retries commits batched by a
// CommitInterval.
const closeFlushTimeout = 10 * time.Second

func (r *Reader) absorb(inner *kafka.Reader) kafka.ReaderStats {
	st := inner.Stats()
	r.mu.Lock()
	addStats(&r.acc, st)
	r.mu.Unlock()
	return st
}
