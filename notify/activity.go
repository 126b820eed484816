package notify

import (
	"sync"
	"sync/atomic"
)

// Activity is what a process tells kcr about its work, so that a supervisor
// such as "kcr standby" can tell when it is idle without guessing from
// outside. kcr polls it over the control socket.
//
// A process is idle for D when, over all of D, Count did not change,
// OpenConns was 0 and HooksInFlight was false.
type Activity struct {
	// Count only grows: every record fetched, produced or committed through
	// kafkahooks or kgohooks, every connection dialed through
	// hooks.TrackConns, and every Touch add to it.
	Count uint64
	// OpenConns is the number of connections open now in every
	// hooks.Conns of the registry (and any other AddOpenGauge).
	OpenConns int
	// HooksInFlight is true while a checkpoint cycle's hooks run.
	HooksInFlight bool
}

type activity struct {
	count atomic.Uint64

	mu     sync.Mutex
	gauges map[*openGauge]struct{}
}

type openGauge struct{ open func() int }

// Touch marks work done by the application, for work the hooks do not see
// (an HTTP request served, a timer's job): it adds 1 to the default
// registry's activity count. It costs one atomic add.
func Touch() { Default.Touch(1) }

// Touch adds n (records, requests) to the registry's activity count. The
// Kafka hooks call it for every record fetched, produced and committed.
func (g *Registry) Touch(n int) {
	if n > 0 {
		g.act.count.Add(uint64(n))
	}
}

// AddOpenGauge makes open part of OpenConns: while it returns more than
// 0, the process is not idle. hooks.TrackConns adds its open connections.
// The returned function removes it.
func (g *Registry) AddOpenGauge(open func() int) (remove func()) {
	og := &openGauge{open: open}
	g.act.mu.Lock()
	if g.act.gauges == nil {
		g.act.gauges = map[*openGauge]struct{}{}
	}
	g.act.gauges[og] = struct{}{}
	g.act.mu.Unlock()
	return func() {
		g.act.mu.Lock()
		delete(g.act.gauges, og)
		g.act.mu.Unlock()
	}
}

// Activity returns the registry's activity now.
func (g *Registry) Activity() Activity {
	a := Activity{Count: g.act.count.Load(), HooksInFlight: g.cycling()}
	g.act.mu.Lock()
	gauges := make([]*openGauge, 0, len(g.act.gauges))
	for og := range g.act.gauges {
		gauges = append(gauges, og)
	}
	g.act.mu.Unlock()
	for _, og := range gauges { // outside the lock: a gauge may take its own
		if n := og.open(); n > 0 {
			a.OpenConns += n
		}
	}
	return a
}
