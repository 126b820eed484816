package kgohooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// errRetired is what the dials of a kgo client replaced after a restore
// get: the client is being closed and must not reach the broker again.
var errRetired = errors.New("kgohooks: this kgo client was replaced after a restore")

// dialGate is the kgo.Dialer of one kgo client. It tracks the client's
// connections so that a checkpoint can close them without closing the
// client (kgo has no other way), and holds new dials while the gate is
// shut, so that no connection is open at the dump.
type dialGate struct {
	dial func(context.Context, string, string) (net.Conn, error)

	mu      sync.Mutex
	conns   map[*trackedConn]struct{}
	dialing map[*dialing]struct{} // dials on the network now
	shut    chan struct{}         // non-nil while dials wait; closed when they may go on
	retired bool
}

// dialing is one dial on the network: cut cancels it and waits for it, so
// that not even a half-open socket is left at the dump.
type dialing struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// newDialGate wraps dial, the function kgo would dial with (the user's
// Dialer, or kgo's own built from DialTimeout and DialTLSConfig).
func newDialGate(dial func(context.Context, string, string) (net.Conn, error)) *dialGate {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	return &dialGate{dial: dial, conns: map[*trackedConn]struct{}{}, dialing: map[*dialing]struct{}{}}
}

// opts are the kgo options that make kgo dial through g.
func (g *dialGate) opts() []kgo.Opt {
	return []kgo.Opt{kgo.DialTLSConfig(nil), kgo.Dialer(g.Dial)}
}

// Dial is the kgo.Dialer: it waits while the gate is shut, and a connection
// that was being dialed when it shut is closed and dialed again later.
func (g *dialGate) Dial(ctx context.Context, network, host string) (net.Conn, error) {
	for {
		if err := g.wait(ctx); err != nil {
			return nil, err
		}
		d, dctx := g.startDial(ctx)
		if d == nil {
			continue // the gate shut in between
		}
		c, err := g.dial(dctx, network, host)
		canceled := dctx.Err() != nil && ctx.Err() == nil // by cut
		g.mu.Lock()
		delete(g.dialing, d)
		var tc *trackedConn
		if err == nil && g.shut == nil && !g.retired {
			tc = &trackedConn{Conn: c, g: g}
			g.conns[tc] = struct{}{}
		}
		g.mu.Unlock()
		if err == nil && tc == nil {
			c.Close() // before done: cut waits for it
		}
		close(d.done)
		d.cancel()
		if tc != nil {
			return tc, nil
		}
		if err != nil && !canceled {
			return nil, err
		}
	}
}

// startDial registers a dial, or returns nil if the gate is shut.
func (g *dialGate) startDial(ctx context.Context) (*dialing, context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil || g.retired {
		return nil, nil
	}
	dctx, cancel := context.WithCancel(ctx)
	d := &dialing{cancel: cancel, done: make(chan struct{})}
	g.dialing[d] = struct{}{}
	return d, dctx
}

func (g *dialGate) wait(ctx context.Context) error {
	g.mu.Lock()
	shut, retired := g.shut, g.retired
	g.mu.Unlock()
	if retired {
		return errRetired
	}
	if shut == nil {
		return nil
	}
	select {
	case <-shut:
		return g.wait(ctx)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cut shuts the gate, cancels the dials on the network and waits for them,
// and closes every open connection; it returns how many it closed. It fails
// only if ctx ends before a dial gives up.
func (g *dialGate) cut(ctx context.Context) (int, error) {
	g.mu.Lock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
	var dials []*dialing
	for d := range g.dialing {
		d.cancel()
		dials = append(dials, d)
	}
	g.mu.Unlock()
	for _, d := range dials {
		select {
		case <-d.done:
		case <-ctx.Done():
			return 0, fmt.Errorf("kgohooks: a dial to the broker did not end when canceled: %w", context.Cause(ctx))
		}
	}
	g.mu.Lock()
	conns := make([]*trackedConn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns), nil
}

// open lets dials go on (after a resume).
func (g *dialGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// retire makes every waiting and later dial fail (the client is replaced).
func (g *dialGate) retire() {
	g.mu.Lock()
	g.retired = true
	g.mu.Unlock()
	g.open()
}

// openConns returns the number of connections open now.
func (g *dialGate) openConns() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

// trackedConn removes itself from its gate when closed.
type trackedConn struct {
	net.Conn
	g    *dialGate
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return err
}
