package kafkahooks

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// ErrConnsClosed is returned by dials through a connection set that a
// checkpoint (or Close) has shut for good.
var ErrConnsClosed = errors.New("kafkahooks: connection set closed for a checkpoint")

// connTracker wraps a dial function and remembers every connection it opened
// until that connection is closed, so that all of them, idle or busy, can be
// closed at once before a checkpoint. Dials in progress are aborted too: a
// socket still connecting could not be checkpointed.
//
// A tracker is open, paused (dials wait until resume or their ctx ends) or
// closed (dials fail with ErrConnsClosed; used for a Kafka client generation
// that is being abandoned, whose goroutines must not reconnect).
type connTracker struct {
	dial  func(ctx context.Context, network, address string) (net.Conn, error)
	dials *atomic.Int64 // shared counter of successful dials, may be nil

	mu        sync.Mutex
	conns     map[*trackedConn]struct{}
	closed    bool
	paused    chan struct{}   // non-nil while paused; closed by resume
	abort     context.Context // canceled by closeAll: aborts dials in progress
	abortDial context.CancelFunc
	dialing   int
}

func newConnTracker(dial func(ctx context.Context, network, address string) (net.Conn, error), dials *atomic.Int64) *connTracker {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	t := &connTracker{dial: dial, dials: dials, conns: make(map[*trackedConn]struct{})}
	t.abort, t.abortDial = context.WithCancel(context.Background())
	return t
}

// DialContext dials through the wrapped function and tracks the connection.
func (t *connTracker) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	for {
		abort, err := t.admit(ctx)
		if err != nil {
			return nil, err
		}
		dctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(abort, cancel)
		c, err := t.dial(dctx, network, address)
		stop()
		cancel()

		t.mu.Lock()
		t.dialing--
		aborted := abort.Err() != nil
		switch {
		case err != nil:
			closed := t.closed
			t.mu.Unlock()
			if !aborted || ctx.Err() != nil {
				return nil, err
			}
			if closed {
				return nil, ErrConnsClosed
			}
			continue // paused while dialing: dial again after the resume
		case t.closed:
			t.mu.Unlock()
			c.Close()
			return nil, ErrConnsClosed
		case aborted || t.paused != nil:
			// This connection must not outlive the pause. Drop it and
			// dial again after the resume.
			t.mu.Unlock()
			c.Close()
			continue
		}
		tc := &trackedConn{Conn: c, t: t}
		t.conns[tc] = struct{}{}
		t.mu.Unlock()
		if t.dials != nil {
			t.dials.Add(1)
		}
		return tc, nil
	}
}

// admit waits while the tracker is paused and fails once it is closed. On
// success it counts a dial in progress and returns the context that aborts it.
func (t *connTracker) admit(ctx context.Context) (context.Context, error) {
	for {
		t.mu.Lock()
		closed, paused := t.closed, t.paused
		if !closed && paused == nil {
			t.dialing++
			abort := t.abort
			t.mu.Unlock()
			return abort, nil
		}
		t.mu.Unlock()
		if closed {
			return nil, ErrConnsClosed
		}
		select {
		case <-paused:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// closeAll closes every tracked connection, aborts the dials in progress and
// waits (up to a second) for them to give up their sockets. If permanent,
// later dials fail; otherwise they wait for resume. It returns how many
// connections were open.
func (t *connTracker) closeAll(permanent bool) int {
	t.mu.Lock()
	if permanent {
		t.closed = true
		if t.paused != nil {
			close(t.paused)
			t.paused = nil
		}
	} else if t.paused == nil && !t.closed {
		t.paused = make(chan struct{})
	}
	t.abortDial()
	conns := t.conns
	t.conns = make(map[*trackedConn]struct{})
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		t.mu.Lock()
		n := t.dialing
		t.mu.Unlock()
		if n == 0 {
			break
		}
	}
	return len(conns)
}

// resume lets dials through again after closeAll(false).
func (t *connTracker) resume() {
	t.mu.Lock()
	if t.paused != nil {
		close(t.paused)
		t.paused = nil
		t.abort, t.abortDial = context.WithCancel(context.Background())
	}
	t.mu.Unlock()
}

// open returns the number of tracked connections not closed yet.
func (t *connTracker) open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

type trackedConn struct {
	net.Conn
	t *connTracker
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}

// Conns is a set of network connections that takes part in checkpoints:
// before a checkpoint it closes every connection it dialed, busy or idle, and
// makes new dials wait until the process is resumed or restored; after that,
// dials go through again and the client reconnects on its own.
//
// Use it for clients other than kafka-go that keep connections open, such as
// a schema registry's HTTP client:
//
//	conns := kafkahooks.TrackConns("schema-registry", nil)
//	client := &http.Client{Transport: &http.Transport{DialContext: conns.DialContext}}
//
// A request that was using a connection when the checkpoint closed it fails
// with a network error, as it would if the server went away; most HTTP
// clients retry idempotent requests on a fresh connection. To drain in-flight
// requests first, register your own hook with OnCheckpoint before this one
// (hooks run in reverse registration order before a checkpoint).
type Conns struct {
	t          *connTracker
	log        *slog.Logger
	unregister func()

	mu     sync.Mutex
	report map[string]any
}

// TrackConns returns a Conns registered under name. dial is the function
// used to open connections; nil means a net.Dialer with a 10 s timeout.
func TrackConns(name string, dial func(ctx context.Context, network, address string) (net.Conn, error), opts ...Opt) *Conns {
	cfg := newConfig(name, opts)
	c := &Conns{t: newConnTracker(dial, nil), log: cfg.log}
	c.unregister = cfg.registry.Register(cfg.name, c)
	return c
}

// DialContext opens a tracked connection. During a checkpoint it waits until
// the process is resumed or restored, or until ctx ends.
func (c *Conns) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return c.t.DialContext(ctx, network, address)
}

// Open returns how many tracked connections are open.
func (c *Conns) Open() int { return c.t.open() }

// BeforeCheckpoint closes every tracked connection and holds new dials.
func (c *Conns) BeforeCheckpoint(ctx context.Context) error {
	n := c.t.closeAll(false)
	c.log.Debug("connections closed for a checkpoint", "connections", n)
	c.mu.Lock()
	c.report = map[string]any{"connections_closed": n}
	c.mu.Unlock()
	return nil
}

// AfterRestore lets dials through again.
func (c *Conns) AfterRestore(ctx context.Context, ev notify.Event) error {
	c.t.resume()
	return nil
}

// CheckpointReport implements notify.Reporter.
func (c *Conns) CheckpointReport() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return copyMap(c.report)
}

// Close unregisters the set, closes its connections and makes later dials
// fail with ErrConnsClosed.
func (c *Conns) Close() error {
	c.unregister()
	c.t.closeAll(true)
	return nil
}

// OnCheckpoint registers a pair of hooks under name, for a client that needs
// custom quiescing, and returns the function that removes them. Either hook
// may be nil. It is notify.Register(name, notify.Func(before, after)) with
// the registry chosen by WithRegistry.
func OnCheckpoint(name string, before func(context.Context) error, after func(context.Context, notify.Event) error, opts ...Opt) (unregister func()) {
	cfg := newConfig(name, opts)
	return cfg.registry.Register(cfg.name, notify.Func(before, after))
}

// IdleConns registers a hook that calls t.CloseIdleConnections before every
// checkpoint; t is typically an *http.Transport or a *kafka.Transport whose
// requests are over by then. Connections that are busy when the hook runs are
// not closed (net/http closes them when their request ends, if the transport
// is idle by then); use TrackConns to close busy connections too. Pools
// reconnect on their own after the restore, so there is no after hook.
func IdleConns(name string, t interface{ CloseIdleConnections() }, opts ...Opt) (unregister func()) {
	return OnCheckpoint(name, func(context.Context) error {
		t.CloseIdleConnections()
		return nil
	}, nil, opts...)
}

func copyMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
