package kafkahooks

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/hookreport"
	"github.com/kcr-dev/kcr/internal/quiesce"
	"github.com/kcr-dev/kcr/notify"
)

// gateView is implemented by the state a gate publishes: a closed gate
// holds callers until the channel it returns is closed; a shut one (after
// Close) turns them away.
type gateView[S any] interface {
	*S
	// blocking returns the channel closed when the gate opens again (nil
	// while it is open) and whether the resource is closed for good.
	blocking() (gate chan struct{}, closed bool)
}

// gate is what Writer and Reader share: the published state that
// calls load on their hot path, the count of callers waiting at it, the
// report of the last hook run and the client-id policy.
type gate[S any, P gateView[S], R any] struct {
	state   atomic.Pointer[S]
	blocked watchedCount // callers waiting at the gate

	idMu         sync.Mutex // guards baseClientID and clientID; a leaf lock
	baseClientID string
	clientID     string

	reports hookreport.Slot[R]
}

// setBaseClientID picks the base client id: the option, else the client's
// own setting, else kafka-go's default.
func (g *gate[S, P, R]) setBaseClientID(option, client string) {
	g.idMu.Lock()
	defer g.idMu.Unlock()
	switch {
	case option != "":
		g.baseClientID = option
	case client != "":
		g.baseClientID = client
	default:
		g.baseClientID = kafka.DefaultClientID
	}
	g.clientID = g.baseClientID
}

// renewClientID gives a restored instance a client id of its own (base +
// "-" + the first 8 hex digits of its instance id); a resume keeps the
// current one.
func (g *gate[S, P, R]) renewClientID(ev notify.Event) {
	g.idMu.Lock()
	defer g.idMu.Unlock()
	if ev.Kind == notify.Restore {
		g.clientID = g.baseClientID + "-" + ev.ShortID()
	}
}

// currentClientID returns the client id sent to brokers now.
func (g *gate[S, P, R]) currentClientID() string {
	g.idMu.Lock()
	defer g.idMu.Unlock()
	return g.clientID
}

// wait blocks a caller at the closed gate of s until it opens or ctx ends;
// if the resource is closed it returns closedErr at once.
func (g *gate[S, P, R]) wait(ctx context.Context, s P, closedErr error) error {
	ch, closed := s.blocking()
	if closed {
		return closedErr
	}
	return quiesce.Wait(ctx, ch, &g.blocked)
}

// watchedCount is an atomic count that calls onChange, when set (by tests,
// before the first use), after each Add: tests wait on it, not poll it.
type watchedCount struct {
	atomic.Int64
	onChange func()
}

// Add adds d and returns the new count, as atomic.Int64's.
func (c *watchedCount) Add(d int64) int64 {
	n := c.Int64.Add(d)
	if c.onChange != nil {
		c.onChange()
	}
	return n
}

// gatedCall calls call with the current state whenever the gate is open,
// and waits at it while it is closed; call returns again=true when a
// checkpoint began under it and the call must be decided afresh after it.
func gatedCall[T, S, R any, P gateView[S]](ctx context.Context, g *gate[S, P, R], closedErr error, call func(s P) (v T, again bool, err error)) (T, error) {
	return gatedCallAt(ctx, g, closedErr, nil, call)
}

// gatedCallAt is gatedCall that runs atGate, when set, each time the call
// is about to wait at a closed gate of a resource still open: a caller that
// the checkpoint must know about (a commit) is noted before it blocks.
func gatedCallAt[T, S, R any, P gateView[S]](ctx context.Context, g *gate[S, P, R], closedErr error, atGate func(), call func(s P) (v T, again bool, err error)) (T, error) {
	for {
		s := P(g.state.Load())
		if ch, closed := s.blocking(); ch != nil || closed {
			if atGate != nil && !closed {
				atGate()
			}
			if err := g.wait(ctx, s, closedErr); err != nil {
				var zero T
				return zero, err
			}
			continue
		}
		v, again, err := call(s)
		if again {
			continue
		}
		return v, err
	}
}
