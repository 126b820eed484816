package kgohooks

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/internal/hookreport"
	"github.com/kcr-dev/kcr/internal/quiesce"
)

// ShareConsumer is a member of a Kafka share group (KIP-932, kgo.ShareGroup)
// that takes part in kcr checkpoints. It has the kgo.Client methods a share
// consumer calls (PollFetches, PollRecords, MarkAcks, FlushAcks, Close) and
// behaves like kgo outside checkpoints; records are acknowledged as with kgo
// (Record.Ack, MarkAcks, or the next poll's auto-accept).
//
// A checkpoint never lets an acquired record into the image: before the
// dump the application's records are accepted or released, the
// acknowledgements flushed, and the member leaves the share group; after
// it, every restored copy (and the original, if it goes on) joins as a new
// member with a new kgo client. See docs/share-groups.md for the contract.
//
// Produce with a Client of this package created before the ShareConsumer:
// hooks run in reverse registration order, so the ShareConsumer is quiesced
// first, while the application can still produce the results of the records
// it holds.
type ShareConsumer struct {
	cfg          config
	kopts        []kgo.Opt
	group        string
	baseClientID string
	dialFn       func(context.Context, string, string) (net.Conn, error)

	st      atomic.Pointer[shareState]
	polls   atomic.Int64 // polls inside kgo
	blocked atomic.Int64 // callers waiting at the gate
	// held is how many records the last poll handed to the application,
	// until it polls again (it has then finished with them); heldGen is the
	// generation of the client that handed them out.
	held    atomic.Int64
	heldGen atomic.Uint64

	unregister func()
	reports    hookreport.Slot[ShareReport]

	mu       sync.Mutex
	gate     chan struct{} // non-nil during a checkpoint
	closed   bool
	clientID string
	gen      uint64
}

// shareState is one kgo client and whether the gate is closed in front of
// it. It is replaced, never changed.
type shareState struct {
	cl     *kgo.Client
	dial   *conntrack.Tracker
	gen    uint64
	gate   chan struct{} // non-nil while the gate is closed; closed when it opens
	stop   context.Context
	cancel context.CancelFunc
	closed bool // Close was called
	torn   bool // the checkpoint left the group and closed cl
}

func newShareState(cl *kgo.Client, dial *conntrack.Tracker, gen uint64) *shareState {
	ctx, cancel := context.WithCancel(context.Background())
	return &shareState{cl: cl, dial: dial, gen: gen, stop: ctx, cancel: cancel}
}

// with returns a copy of s behind gate.
func (s *shareState) with(gate chan struct{}, torn bool) *shareState {
	return &shareState{cl: s.cl, dial: s.dial, gen: s.gen, gate: gate, stop: s.stop, cancel: s.cancel, closed: s.closed, torn: torn}
}

// NewShareConsumer returns a ShareConsumer built from the kgo options kopts,
// which must name the group with kgo.ShareGroup and its topics with
// kgo.ConsumeTopics. It registers with the registry of WithRegistry
// (default notify.Default). The options of this package that apply are
// WithRegistry, WithName, WithLogger, WithHeldPolicy and WithHeldWait.
//
// kgo.ClientID (default "kgo") is the base client id: after each restore
// the client id is base + "-" + the first 8 hex digits of
// notify.Event.InstanceID.
func NewShareConsumer(kopts []kgo.Opt, opts ...Opt) (*ShareConsumer, error) {
	dprobe, err := kgo.NewClient(append(slices.Clip(kopts), kgo.ConsumeTopics(), kgo.DialTLSConfig(nil),
		kgo.Dialer(func(context.Context, string, string) (net.Conn, error) { return nil, errNoDial }),
		kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return nil, err
	}
	group, _ := dprobe.OptValue(kgo.ShareGroup).(string)
	clientID, _ := dprobe.OptValue(kgo.ClientID).(string)
	dprobe.Close()
	if group == "" {
		return nil, errors.New("kgohooks: a ShareConsumer needs kgo.ShareGroup; use New for other clients")
	}
	// The user's dialer, from a client without topics, which never joins
	// and so never dials.
	uprobe, err := kgo.NewClient(append(slices.Clip(kopts), kgo.ConsumeTopics())...)
	if err != nil {
		return nil, err
	}
	userDial, _ := uprobe.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	uprobe.Close()
	c := &ShareConsumer{cfg: newConfig(opts), kopts: slices.Clip(kopts), group: group, baseClientID: clientID, dialFn: userDial}
	if c.cfg.name == "" {
		c.cfg.name = "kgo-share/" + group
	}
	c.cfg.log = c.cfg.log.With("resource", c.cfg.name)
	c.clientID, c.gen = clientID, 1
	cl, dial, err := c.build()
	if err != nil {
		return nil, err
	}
	c.st.Store(newShareState(cl, dial, c.gen))
	c.unregister = c.cfg.registry.Register(c.cfg.name, c)
	return c, nil
}

// build creates a kgo client with the user's options and the current client
// id, dialing through a tracker so that a checkpoint can close every
// connection. Called with c.mu held or before c is shared.
func (c *ShareConsumer) build() (*kgo.Client, *conntrack.Tracker, error) {
	dial := conntrack.New(c.dialFn, nil)
	opts := append(slices.Clip(c.kopts), kgo.ClientID(c.clientID), kgo.DialTLSConfig(nil), kgo.Dialer(dial.DialContext))
	cl, err := kgo.NewClient(opts...)
	return cl, dial, err
}

// enter counts a poll and returns the state to make it on, waiting at a
// closed gate.
func (c *ShareConsumer) enter(ctx context.Context) (*shareState, error) {
	for {
		c.polls.Add(1)
		s := c.st.Load()
		if s.gate == nil {
			return s, nil
		}
		c.polls.Add(-1)
		if s.closed {
			return nil, kgo.ErrClientClosed
		}
		if err := quiesce.Wait(ctx, s.gate, &c.blocked); err != nil {
			return nil, err
		}
	}
}

// PollFetches is kgo.Client.PollFetches for the share group.
func (c *ShareConsumer) PollFetches(ctx context.Context) kgo.Fetches { return c.PollRecords(ctx, -1) }

// PollRecords is kgo.Client.PollRecords for the share group. Polling again
// tells kgo, and the checkpoint, that the application is done with the
// records of its last poll: those it did not acknowledge are accepted, as
// kgo does. A poll that waits when a checkpoint begins ends without records
// and waits at the gate; a poll during a checkpoint waits there too. It
// returns the records of the kgo client of the moment, never an error
// caused by the checkpoint.
func (c *ShareConsumer) PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches {
	c.handBack()
	for {
		s, err := c.enter(ctx)
		if err != nil {
			return kgo.NewErrFetch(err)
		}
		fs, interrupted := pollUntilStopped(ctx, s.stop, s.cl, maxPollRecords)
		if n := fs.NumRecords(); n > 0 {
			c.heldGen.Store(s.gen)
			c.held.Store(int64(n))
			c.cfg.registry.Touch(n) // notify.Activity
		}
		c.polls.Add(-1)
		if interrupted && fs.NumRecords() == 0 && len(fs.Errors()) == 0 {
			continue // the checkpoint ended this poll: wait at the gate
		}
		return fs
	}
}

// handBack marks the records of the last poll as done: during a checkpoint
// it accepts those the application did not acknowledge, as kgo's next poll
// would, since the poll now waits at the gate instead of reaching kgo.
func (c *ShareConsumer) handBack() {
	if c.held.Load() == 0 {
		return
	}
	if s := c.st.Load(); s.gate != nil && !s.torn && s.gen == c.heldGen.Load() {
		s.cl.MarkAcks(kgo.AckAccept)
	}
	c.held.Store(0)
}

// Held returns how many records the last poll handed to the application
// that it has not handed back by polling again.
func (c *ShareConsumer) Held() int64 { return c.held.Load() }

// Quiescing returns a channel that is closed when a checkpoint begins: a
// handler holding many records may release the rest (MarkAcks with
// kgo.AckRelease) and poll again, so that the checkpoint does not wait for
// it. Ask for it per poll; the next kgo client has a new one.
func (c *ShareConsumer) Quiescing() <-chan struct{} { return c.st.Load().stop.Done() }

// MarkAcks is kgo.Client.MarkAcks on the current kgo client. Records
// handed out before a checkpoint were all accepted or released by it: their
// acknowledgements change nothing.
func (c *ShareConsumer) MarkAcks(status kgo.AckStatus, rs ...*kgo.Record) {
	c.st.Load().cl.MarkAcks(status, rs...)
}

// FlushAcks is kgo.Client.FlushAcks on the current kgo client; it passes the
// closed gate of a checkpoint, so that a handler can finish its work.
func (c *ShareConsumer) FlushAcks(ctx context.Context) error {
	return c.st.Load().cl.FlushAcks(ctx)
}

// ClientID returns the client id the current kgo client sends.
func (c *ShareConsumer) ClientID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clientID
}

// Group returns the share group.
func (c *ShareConsumer) Group() string { return c.group }

// Name returns the name the consumer is registered under.
func (c *ShareConsumer) Name() string { return c.cfg.name }

// Underlying returns the current kgo client, for calls the wrapper does not
// gate (metrics, admin requests). Every checkpoint replaces it: do not keep
// it.
func (c *ShareConsumer) Underlying() *kgo.Client { return c.st.Load().cl }

// Close is kgo.Client.Close: it releases the records the application has
// not acknowledged and leaves the share group. It also unregisters the
// consumer; callers waiting at the gate get kgo.ErrClientClosed.
func (c *ShareConsumer) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	s := c.st.Load()
	closed := s.with(make(chan struct{}), s.torn)
	closed.closed = true
	c.st.Store(closed)
	if c.gate != nil {
		close(c.gate)
		c.gate = nil
	}
	c.mu.Unlock()
	c.unregister()
	s.cancel()
	if s.torn {
		return
	}
	if s.gate != nil {
		// Closed during a checkpoint: fail new dials rather than reconnect.
		s.dial.CloseAll(true)
	}
	s.cl.Close()
}

// CheckpointReport implements notify.Reporter: Report as a map, which lands
// in the image manifest; nil before the first hook run.
func (c *ShareConsumer) CheckpointReport() map[string]any { return c.reports.Map() }

// Report returns the report of the last hook run, and false before the
// first one.
func (c *ShareConsumer) Report() (ShareReport, bool) { return c.reports.Load() }
