// Package hooks lets any client take part in kcr checkpoints: a pair of
// hooks of your own (OnCheckpoint), an HTTP or database pool's idle
// connections (IdleConns), or every connection a dialer opened (TrackConns).
// Kafka clients have their own package, kafkahooks.
package hooks

import (
	"context"
	"log/slog"
	"net"
	"sync"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/kcr-dev/kcr/internal/hookopt"
	"github.com/kcr-dev/kcr/notify"
)

// ErrConnsClosed is returned by dials through a Conns after Close.
var ErrConnsClosed = conntrack.ErrClosed

// Opt configures OnCheckpoint, IdleConns and TrackConns.
type Opt interface {
	apply(*config)
}

type opt func(*config)

func (o opt) apply(c *config) { o(c) }

type config struct {
	registry *notify.Registry
	log      *slog.Logger
}

func newConfig(opts []Opt) config {
	var c config
	hookopt.Apply(&c, opts, Opt.apply)
	c.registry, c.log = hookopt.Defaults(c.registry, c.log)
	return c
}

// WithRegistry registers the hooks with r instead of notify.Default (the
// default). Tests use it to run checkpoint cycles with
// (*notify.Registry).Simulate on a registry of their own.
func WithRegistry(r *notify.Registry) Opt { return opt(func(c *config) { c.registry = r }) }

// WithLogger sets the logger (default slog.Default()). Every record carries
// the attribute resource=<name>.
func WithLogger(l *slog.Logger) Opt { return opt(func(c *config) { c.log = l }) }

// ConnsReport is what Conns reports about its last checkpoint.
type ConnsReport struct {
	ConnectionsClosed int `json:"connections_closed"` // connections the hook closed
}

// Conns is a set of network connections that takes part in checkpoints:
// before a checkpoint it closes every connection it dialed, busy or idle, and
// makes new dials wait until the process is resumed or restored; after that,
// dials go through again and the client reconnects on its own.
//
// Use it for clients other than kafka-go that keep connections open, such as
// a schema registry's HTTP client:
//
//	conns := hooks.TrackConns("schema-registry", nil)
//	client := &http.Client{Transport: &http.Transport{DialContext: conns.DialContext}}
//
// A request that was using a connection when the checkpoint closed it fails
// with a network error, as it would if the server went away; most HTTP
// clients retry idempotent requests on a fresh connection. To drain in-flight
// requests first, register your own hook with OnCheckpoint before this one
// (hooks run in reverse registration order before a checkpoint).
type Conns struct {
	t          *conntrack.Tracker
	log        *slog.Logger
	registry   *notify.Registry
	unregister func()
	ungauge    func()

	mu     sync.Mutex
	report *ConnsReport // nil before the first checkpoint
}

// TrackConns returns a Conns registered under name. dial is the function
// used to open connections; nil means a net.Dialer with a 10 s timeout.
func TrackConns(name string, dial func(ctx context.Context, network, address string) (net.Conn, error), opts ...Opt) *Conns {
	cfg := newConfig(opts)
	c := &Conns{t: conntrack.New(dial, nil), log: cfg.log.With("resource", name), registry: cfg.registry}
	c.unregister = cfg.registry.Register(name, c)
	// Open connections keep the process from being idle (notify.Activity).
	c.ungauge = cfg.registry.AddOpenGauge(c.t.Open)
	return c
}

// DialContext opens a tracked connection. During a checkpoint it waits until
// the process is resumed or restored, or until ctx ends.
func (c *Conns) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	conn, err := c.t.DialContext(ctx, network, address)
	if err == nil {
		c.registry.Touch(1)
	}
	return conn, err
}

// Open returns how many tracked connections are open.
func (c *Conns) Open() int { return c.t.Open() }

// BeforeCheckpoint closes every tracked connection and holds new dials.
func (c *Conns) BeforeCheckpoint(ctx context.Context) error {
	n := c.t.CloseAll(false)
	c.log.Debug("connections closed for a checkpoint", "connections", n)
	c.mu.Lock()
	c.report = &ConnsReport{ConnectionsClosed: n}
	c.mu.Unlock()
	return nil
}

// AfterRestore lets dials through again.
func (c *Conns) AfterRestore(ctx context.Context, ev notify.Event) error {
	c.t.Resume()
	return nil
}

// CheckpointReport implements notify.Reporter.
func (c *Conns) CheckpointReport() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.report == nil {
		return nil
	}
	return map[string]any{"connections_closed": c.report.ConnectionsClosed}
}

// Close unregisters the set, closes its connections and makes later dials
// fail with ErrConnsClosed.
func (c *Conns) Close() error {
	c.unregister()
	c.ungauge()
	c.t.CloseAll(true)
	return nil
}

// OnCheckpoint registers a pair of hooks under name, for a client that needs
// custom quiescing, and returns the function that removes them. Either hook
// may be nil. It is notify.Register(name, notify.Func(before, after)) with
// the registry chosen by WithRegistry.
func OnCheckpoint(name string, before func(context.Context) error, after func(context.Context, notify.Event) error, opts ...Opt) (unregister func()) {
	cfg := newConfig(opts)
	return cfg.registry.Register(name, notify.Func(before, after))
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
