// Package conntrack tracks the network connections a client dials, so that
// a checkpoint can close all of them, busy or idle, and hold new dials until
// the process is resumed, or fail them for good. CRIU cannot dump a socket
// that is still connecting, and a Kafka client must not carry an open
// connection into an image.
package conntrack

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by dials through a Tracker that CloseAll(true) has
// shut for good.
var ErrClosed = errors.New("connection set closed for a checkpoint")

// Tracker wraps a dial function and remembers every connection it opened
// until that connection is closed, so that all of them, idle or busy, can be
// closed at once before a checkpoint. Dials in progress are aborted too: a
// socket still connecting could not be checkpointed.
//
// A tracker is open, paused (dials wait until Resume or their ctx ends) or
// closed (dials fail with ErrClosed; used for a Kafka client generation
// that is being abandoned, whose goroutines must not reconnect).
type Tracker struct {
	dial  func(ctx context.Context, network, address string) (net.Conn, error)
	dials *atomic.Int64 // shared counter of successful dials, may be nil

	mu        sync.Mutex
	conns     map[*trackedConn]struct{}
	closed    bool
	paused    chan struct{}   // non-nil while paused; closed by Resume
	abort     context.Context // canceled by CloseAll: aborts dials in progress
	abortDial context.CancelFunc
	dialing   int
}

// New returns a Tracker dialing with dial (nil: a net.Dialer with a 10 s
// timeout); dials, if not nil, counts successful dials.
func New(dial func(ctx context.Context, network, address string) (net.Conn, error), dials *atomic.Int64) *Tracker {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	t := &Tracker{dial: dial, dials: dials, conns: make(map[*trackedConn]struct{})}
	t.abort, t.abortDial = context.WithCancel(context.Background())
	return t
}

// DialContext dials through the wrapped function and tracks the connection.
func (t *Tracker) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
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
				return nil, ErrClosed
			}
			continue // paused while dialing: dial again after the resume
		case t.closed:
			t.mu.Unlock()
			c.Close()
			return nil, ErrClosed
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
func (t *Tracker) admit(ctx context.Context) (context.Context, error) {
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
			return nil, ErrClosed
		}
		select {
		case <-paused:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// CloseAll closes every tracked connection, aborts the dials in progress and
// waits (up to a second) for them to give up their sockets. If permanent,
// later dials fail; otherwise they wait for Resume. It returns how many
// connections were open.
func (t *Tracker) CloseAll(permanent bool) int {
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

// Resume lets dials through again after CloseAll(false).
func (t *Tracker) Resume() {
	t.mu.Lock()
	if t.paused != nil {
		close(t.paused)
		t.paused = nil
		t.abort, t.abortDial = context.WithCancel(context.Background())
	}
	t.mu.Unlock()
}

// Open returns the number of tracked connections not closed yet.
func (t *Tracker) Open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

type trackedConn struct {
	net.Conn
	t *Tracker
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}
