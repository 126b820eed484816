package kafkahooks

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kcr-dev/kcr/internal/conntrack"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/sasl"
)

// transportTemplate holds the settings of the user's *kafka.Transport, from
// which a fresh transport is built for every generation of connections.
type transportTemplate struct {
	dial           func(context.Context, string, string) (net.Conn, error)
	dialTimeout    time.Duration
	idleTimeout    time.Duration
	metadataTTL    time.Duration
	metadataTopics []string
	tls            *tls.Config
	sasl           sasl.Mechanism
	resolver       kafka.BrokerResolver
	ctx            context.Context
}

func templateOf(t *kafka.Transport) transportTemplate {
	if t == nil {
		// kafka.DefaultTransport's settings.
		return transportTemplate{dial: (&net.Dialer{Timeout: 3 * time.Second}).DialContext}
	}
	return transportTemplate{
		dial:           t.Dial,
		dialTimeout:    t.DialTimeout,
		idleTimeout:    t.IdleTimeout,
		metadataTTL:    t.MetadataTTL,
		metadataTopics: t.MetadataTopics,
		tls:            t.TLS,
		sasl:           t.SASL,
		resolver:       t.Resolver,
		ctx:            t.Context,
	}
}

// transportGen is one generation of connections: a kafka.Transport whose
// dials are tracked. A paused or closed generation has no transport.
type transportGen struct {
	t      *kafka.Transport
	conns  *conntrack.Tracker
	cancel context.CancelFunc
	ready  chan struct{} // paused: closed when a new generation is installed
}

// gatedTransport is the kafka.RoundTripper of every kafka.Writer that a
// Writer creates. It forwards requests to the current generation's
// kafka.Transport; during a checkpoint it has none, and requests wait at its
// gate. After the restore a fresh kafka.Transport (new connections, possibly
// a new client id) takes over, and the waiting requests go out on it.
//
// Produce requests that waited at the gate carry records across the
// checkpoint. They are copied (their record set can be encoded only once)
// and resent until acknowledged, with backoff, while the broker is
// unreachable; they are given up only when the Writer is closed.
type gatedTransport struct {
	tmpl          transportTemplate
	log           *slog.Logger
	resendTimeout time.Duration
	autoCreate    bool // the Writer's AllowAutoTopicCreation
	backoffMin    time.Duration
	backoffMax    time.Duration
	dials         atomic.Int64

	gen atomic.Pointer[transportGen]

	mu       sync.Mutex
	life     context.Context // canceled by stopHeld
	stopLife context.CancelFunc
	stop     <-chan struct{} // life.Done()

	held        atomic.Int64 // produce requests waiting at the gate or being resent
	heldRecords atomic.Int64
	resent      atomic.Int64 // records delivered after being held
	failed      atomic.Int64 // held records failed with a fatal error
	interrupted atomic.Int64 // produce requests cut off on the wire by a pause

	// carrying is set from pause until the Writer has its next
	// kafka.Writer (endCarry): meanwhile every produce request comes from
	// the kafka.Writer closed for the checkpoint and carries its records
	// across it, also one that kafka-go (re)tries only after the restore,
	// having been in its backoff or batch timer at the dump. Such a request
	// must be resent until acknowledged too: sent as usual, a broker that
	// cannot be reached fails it at once (no metadata: "topic not found"),
	// and kafka-go gives the records up.
	carrying atomic.Bool
}

func newGatedTransport(tmpl transportTemplate, clientID string, resendTimeout, bmin, bmax time.Duration, autoCreate bool, log *slog.Logger) *gatedTransport {
	p := &gatedTransport{
		tmpl:          tmpl,
		autoCreate:    autoCreate,
		log:           log,
		resendTimeout: resendTimeout,
		backoffMin:    bmin,
		backoffMax:    bmax,
	}
	p.life, p.stopLife = context.WithCancel(context.Background())
	p.stop = p.life.Done()
	p.gen.Store(p.newGen(clientID))
	return p
}

func (p *gatedTransport) newGen(clientID string) *transportGen {
	base := p.tmpl.ctx
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithCancel(base)
	conns := conntrack.New(p.tmpl.dial, &p.dials)
	t := &kafka.Transport{
		Dial:           conns.DialContext,
		DialTimeout:    p.tmpl.dialTimeout,
		IdleTimeout:    p.tmpl.idleTimeout,
		MetadataTTL:    p.tmpl.metadataTTL,
		MetadataTopics: p.tmpl.metadataTopics,
		ClientID:       clientID,
		TLS:            p.tmpl.tls,
		SASL:           p.tmpl.sasl,
		Resolver:       p.tmpl.resolver,
		Context:        ctx,
	}
	return &transportGen{t: t, conns: conns, cancel: cancel}
}

// RoundTrip implements kafka.RoundTripper. Outside checkpoints it costs two
// atomic loads more than the kafka.Transport it forwards to.
func (p *gatedTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	g := p.gen.Load()
	if g.t != nil {
		if p.carrying.Load() {
			if _, ok := req.(*produce.Request); ok {
				return p.roundTripHeld(ctx, addr, req)
			}
		}
		res, err := g.t.RoundTrip(ctx, addr, req)
		if err == nil || p.gen.Load() == g {
			return res, err
		}
		// A checkpoint closed the connections under this request.
		if _, ok := req.(*produce.Request); ok {
			p.interrupted.Add(1)
			return nil, &interruptedError{err}
		}
	}
	return p.roundTripHeld(ctx, addr, req)
}

// roundTripHeld handles a request that met the gate closed (or, for other
// than produce requests, was interrupted by a checkpoint).
func (p *gatedTransport) roundTripHeld(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if pr, ok := req.(*produce.Request); ok {
		return p.resendCarried(addr, pr)
	}
	return p.roundTripAfterGate(ctx, addr, req)
}

// roundTripAfterGate sends a request other than produce once the gate opens:
// metadata and the like can be sent again as they are, and the caller's ctx
// bounds the wait.
func (p *gatedTransport) roundTripAfterGate(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	for {
		g := p.gen.Load()
		switch {
		case g.t != nil:
			res, err := g.t.RoundTrip(ctx, addr, req)
			if err == nil || p.gen.Load() == g {
				return res, err
			}
		case g.ready != nil:
			select {
			case <-g.ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-p.stop:
				return nil, errTransportClosed
			}
		default:
			return nil, errTransportClosed
		}
	}
}

// resendCarried sends a produce request, not encoded yet, whose records are
// carried across the checkpoint, until it is acknowledged or fails for good.
// The ctx kafka-go gave it (its WriteTimeout) is not taken, since the
// records must not be failed because of a checkpoint; the Writer's Close
// stops the resends.
func (p *gatedTransport) resendCarried(addr net.Addr, pr *produce.Request) (kafka.Response, error) {
	h, err := holdProduce(pr)
	if err != nil {
		return nil, err
	}
	p.held.Add(1)
	p.heldRecords.Add(int64(h.records))
	defer func() {
		p.held.Add(-1)
		p.heldRecords.Add(-int64(h.records))
	}()
	backoff := p.backoffMin
	missing := 0
	for attempt := 1; ; attempt++ {
		g := p.gen.Load()
		switch {
		case g.t != nil:
			rctx, cancel := context.WithTimeout(p.life, p.resendTimeout)
			res, err := g.t.RoundTrip(rctx, addr, h.request())
			cancel()
			if err == nil {
				p.resent.Add(int64(h.records))
				return res, nil
			}
			if p.isStopped() {
				return nil, errTransportClosed
			}
			if p.gen.Load() != g {
				continue // paused again: wait at the gate
			}
			if fatalResend(err) {
				p.failed.Add(int64(h.records))
				p.log.Warn("records carried across a checkpoint failed", "records", h.records, "err", err)
				return nil, &CarriedFailedError{err}
			}
			missing++
			if missingTopic(err) {
				mctx, cancel := context.WithTimeout(p.life, p.resendTimeout)
				if !topicsGone(mctx, g.t, addr, h, p.autoCreate) {
					missing = 0
				}
				cancel()
			} else {
				missing = 0
			}
			if missing >= missingTopicAttempts {
				p.failed.Add(int64(h.records))
				p.log.Warn("records carried across a checkpoint failed: their topic or partition is gone", "records", h.records, "err", err)
				return nil, &CarriedFailedError{err}
			}
			p.log.Debug("resending records held across a checkpoint", "attempt", attempt, "records", h.records, "err", err, "backoff", backoff)
			// Drop the pools so that the next attempt starts with fresh
			// metadata rather than a cached failure.
			g.t.CloseIdleConnections()
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.stop:
				t.Stop()
				return nil, errTransportClosed
			}
			backoff = min(2*backoff, p.backoffMax)
		case g.ready != nil:
			select {
			case <-g.ready:
			case <-p.stop:
				return nil, errTransportClosed
			}
		default:
			return nil, errTransportClosed
		}
	}
}

func (p *gatedTransport) isStopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// pause closes the gate, closes every connection of the current generation
// and discards its transport. It returns how many connections were open.
func (p *gatedTransport) pause() int {
	p.mu.Lock()
	g := p.gen.Load()
	if g.t == nil {
		p.mu.Unlock()
		return 0
	}
	p.carrying.Store(true)
	p.gen.Store(&transportGen{ready: make(chan struct{})})
	p.mu.Unlock()
	return p.retire(g)
}

// endCarry ends what pause began for produce requests: the Writer's next
// kafka.Writer sends its own as usual.
func (p *gatedTransport) endCarry() { p.carrying.Store(false) }

func (p *gatedTransport) retire(g *transportGen) int {
	n := g.conns.CloseAll(true)
	g.t.CloseIdleConnections()
	g.cancel()
	return n
}

// resume installs a fresh transport with clientID and opens the gate.
func (p *gatedTransport) resume(clientID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isStopped() {
		return
	}
	old := p.gen.Load()
	p.gen.Store(p.newGen(clientID))
	if old.ready != nil {
		close(old.ready)
	} else if old.t != nil {
		p.retire(old)
	}
}

// stopHeld makes held produce requests give up.
func (p *gatedTransport) stopHeld() { p.stopLife() }

// shutdown stops held requests and closes every connection for good.
func (p *gatedTransport) shutdown() {
	p.stopHeld()
	p.mu.Lock()
	g := p.gen.Load()
	p.gen.Store(&transportGen{})
	p.mu.Unlock()
	if g.t != nil {
		p.retire(g)
	} else if g.ready != nil {
		close(g.ready)
	}
}

// openConns returns how many connections of the current generation are open.
func (p *gatedTransport) openConns() int {
	if g := p.gen.Load(); g.conns != nil {
		return g.conns.Open()
	}
	return 0
}
