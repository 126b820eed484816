package kafkahooks

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/notify"
)

// ErrConnsClosed is returned by dials through a connection set that a
// checkpoint (or Close) has shut for good.
var ErrConnsClosed = conntrack.ErrClosed

// connTracker is conntrack.Tracker under the names this package's files use.
type connTracker struct{ *conntrack.Tracker }

func newConnTracker(dial func(ctx context.Context, network, address string) (net.Conn, error), dials *atomic.Int64) *connTracker {
	return &connTracker{conntrack.New(dial, dials)}
}

func (t *connTracker) closeAll(permanent bool) int { return t.CloseAll(permanent) }
func (t *connTracker) resume()                     { t.Resume() }
func (t *connTracker) open() int                   { return t.Open() }

// ConnsReport is what Conns reports about its last checkpoint.
type ConnsReport struct {
	ConnectionsClosed int `json:"connections_closed"`
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
	reports    reportSlot[ConnsReport]
}

// TrackConns returns a Conns registered under name. dial is the function
// used to open connections; nil means a net.Dialer with a 10 s timeout.
func TrackConns(name string, dial func(ctx context.Context, network, address string) (net.Conn, error), opts ...Opt) *Conns {
	cfg := newConfig(name, applyAll(opts, Opt.apply))
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
	c.reports.store(ConnsReport{ConnectionsClosed: n})
	return nil
}

// AfterRestore lets dials through again.
func (c *Conns) AfterRestore(ctx context.Context, ev notify.Event) error {
	c.t.resume()
	return nil
}

// CheckpointReport implements notify.Reporter.
func (c *Conns) CheckpointReport() map[string]any {
	return c.reports.asMap()
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
	cfg := newConfig(name, applyAll(opts, Opt.apply))
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
