package kafkahooks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// Writer is a kafka.Writer that takes part in kcr checkpoints. It has the
// methods of kafka.Writer and behaves the same outside checkpoints; it owns
// a sequence of kafka.Writer values (one per checkpoint cycle) that share a
// transport managed by the Writer.
//
// # Before a checkpoint
//
// The Writer closes its gate: WriteMessages calls that start from then on
// block until the process is resumed or restored, or until their own ctx
// ends. No call ever fails because a checkpoint happened.
//
// It then closes the current kafka.Writer, which flushes every batch it
// buffers (also those of an Async writer), waits for the acknowledgements of
// all in-flight records and delivers every Completion callback. If that ends
// within the hook's budget, everything was drained; the Writer then closes
// all connections. (It stops waiting when a tenth of the budget, at most 1 s,
// is left, so that the hooks that run after it, those of resources
// registered before it, still get time.)
//
// If the budget runs out first, the Writer closes every connection anyway
// and the records not yet acknowledged stay in memory, inside the closing
// kafka.Writer: they are part of the image and are sent after the restore,
// before any new record. Sync callers that wrote them keep waiting in
// WriteMessages and get the result of that send. A request that was on the
// wire when its connection was closed is retried by kafka-go (this uses one
// of the batch's MaxAttempts: with MaxAttempts 1 the batch fails, as on any
// network error, and its callers or Completion get the interruption error
// for records that may be on the topic) and may be stored twice: delivery is
// at-least-once, records are not dropped because of a checkpoint. The
// after-restore report counts such requests (requests_interrupted) and the
// records failed by them (records_interrupted).
// CheckpointReport and a warning log say how many records were carried, and
// notify.Carrying puts the count in the image manifest. When the checkpoint
// asks for no carried records (kcr checkpoint --require-drained) the hook
// fails with a notify.CarryError instead: nothing is dumped, and the records
// are sent on resume.
//
// # After a restore or resume
//
// A fresh kafka.Transport is installed. On Restore the client id becomes the
// base id + "-" + the first 8 hex digits of Event.InstanceID, so that clones
// of one image are told apart; on Resume it is unchanged. Carried records are
// sent first, in order (kafka-go keeps the order per partition); when they
// are all acknowledged a new kafka.Writer is created and the gate opens.
//
// If the broker cannot be reached, carried records are resent with backoff
// (WithRetryBackoff) until acknowledged; they are given up only by Close.
// The after-restore hook returns when the gate is open or when its ctx ends;
// in the latter case the resends go on in the background and the gate opens
// when they succeed. Blocked callers wait until then or until their ctx ends.
//
// # Cost
//
// Outside checkpoints WriteMessages costs an atomic load and two atomic adds
// (for the record counts of the report) more than kafka.Writer.WriteMessages,
// and every request an atomic load more than kafka.Transport.RoundTrip:
// 3–9 ns per call at -cpu 1 and 2 (scripts/bench-kafkahooks.sh paired, call-par).
type Writer struct {
	cfg       config
	tmpl      writerTemplate
	transport *gatedTransport
	async     bool
	cb        *callbacks // nil without a user Completion

	gate[writerState, *writerState, WriterReport]
	// inflight counts, in its low 40 bits, the records handed to kafka-go
	// and not yet acknowledged or failed, and above them (callUnit) the
	// calls inside kafka.Writer.WriteMessages: one atomic add on entry and
	// one on exit keep both.
	inflight atomic.Int64
	// interruptedRecs counts records whose write failed because a
	// checkpoint cut their request off with no attempt left.
	interruptedRecs atomic.Int64

	unregister func()
	bg         sync.WaitGroup
	done       chan struct{} // closed by Close

	mu        sync.Mutex
	closing   chan struct{} // non-nil while the gate is closed
	inCycle   bool
	cycle     uint64 // counts BeforeCheckpoint calls
	closed    bool
	closeDone chan struct{} // closed when the kafka.Writer being drained has closed
	statsSrc  *kafka.Writer // the newest kafka.Writer, for Stats
	acc       kafka.WriterStats
}

type writerState struct {
	w      *kafka.Writer // nil while the gate is closed and after Close
	gate   chan struct{} // closed when the gate opens again
	closed bool
}

func (s *writerState) blocking() (chan struct{}, bool) { return s.gate, s.closed }

// writerTemplate holds the settings of the template kafka.Writer. kafka.Writer
// values hold locks, so the settings are copied field by field.
type writerTemplate struct {
	w          kafka.Writer
	completion func([]kafka.Message, error)
}

// NewWriter returns a Writer configured like template, registered with the
// registry (WithRegistry, default notify.Default) under a name (WithName).
//
// Every exported field of template is used, except Transport: it must be nil
// (kafka.DefaultTransport's settings are used) or a *kafka.Transport whose
// settings (Dial, TLS, SASL, timeouts, ClientID, …) are copied into the
// transports the Writer creates. Any other kafka.RoundTripper panics, because
// the Writer could not close its connections. template itself is not used
// after NewWriter returns and must not be used to write.
//
// Changing
//
//	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "events"}
//
// to
//
//	w := kafkahooks.NewWriter(&kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "events"})
//
// is all a service needs.
func NewWriter(template *kafka.Writer, opts ...WriterOpt) *Writer {
	if template == nil {
		panic("kafkahooks: NewWriter with nil template")
	}
	var kt *kafka.Transport
	switch t := template.Transport.(type) {
	case nil:
	case *kafka.Transport:
		kt = t
	default:
		panic(fmt.Sprintf("kafkahooks: NewWriter: unsupported Transport %T; use a *kafka.Transport or nil", template.Transport))
	}
	name := "kafka-writer"
	if template.Topic != "" {
		name += "/" + template.Topic
	}
	cfg := newConfig(name, opts, WriterOpt.applyWriter)
	w := &Writer{cfg: cfg, async: template.Async, done: make(chan struct{})}
	copyWriterSettings(&w.tmpl.w, template)
	w.tmpl.completion = template.Completion
	if template.Completion != nil {
		w.cb = newCallbacks(template.Completion)
	}

	ktID := ""
	if kt != nil {
		ktID = kt.ClientID
	}
	w.setBaseClientID(cfg.clientID, ktID)

	resend := template.WriteTimeout
	if resend <= 0 {
		resend = 10 * time.Second
	}
	w.transport = newGatedTransport(templateOf(kt), w.currentClientID(), resend, cfg.backoffMin, cfg.backoffMax, template.AllowAutoTopicCreation, cfg.log)
	inner := w.newInner()
	w.statsSrc = inner
	w.state.Store(&writerState{w: inner})
	w.unregister = cfg.registry.Register(cfg.name, w)
	return w
}

// NewWriterFromConfig is NewWriter for code that used the deprecated
// kafka.NewWriter(kafka.WriterConfig): the config is turned into a template
// by kafka.NewWriter, with the same defaults. The Dialer's ClientID, TLS,
// SASL and timeouts carry over.
func NewWriterFromConfig(c kafka.WriterConfig, opts ...WriterOpt) *Writer {
	return NewWriter(kafka.NewWriter(c), opts...)
}

func copyWriterSettings(dst, src *kafka.Writer) {
	dst.Addr = src.Addr
	dst.Topic = src.Topic
	dst.Balancer = src.Balancer
	dst.MaxAttempts = src.MaxAttempts
	dst.WriteBackoffMin = src.WriteBackoffMin
	dst.WriteBackoffMax = src.WriteBackoffMax
	dst.BatchSize = src.BatchSize
	dst.BatchBytes = src.BatchBytes
	dst.BatchTimeout = src.BatchTimeout
	dst.ReadTimeout = src.ReadTimeout
	dst.WriteTimeout = src.WriteTimeout
	dst.RequiredAcks = src.RequiredAcks
	dst.Async = src.Async
	dst.Completion = src.Completion
	dst.Compression = src.Compression
	dst.Logger = src.Logger
	dst.ErrorLogger = src.ErrorLogger
	dst.Transport = src.Transport
	dst.AllowAutoTopicCreation = src.AllowAutoTopicCreation
}

// newInner creates the kafka.Writer of a new cycle.
func (w *Writer) newInner() *kafka.Writer {
	inner := &kafka.Writer{}
	copyWriterSettings(inner, &w.tmpl.w)
	inner.Transport = w.transport
	cb := w.cb
	switch {
	case w.async:
		// Count acknowledged records for the checkpoint report.
		inner.Completion = func(msgs []kafka.Message, err error) {
			w.inflight.Add(-int64(len(msgs)))
			if err != nil && isInterrupted(err) {
				w.interruptedRecs.Add(int64(len(msgs)))
			}
			if cb != nil {
				cb.call(msgs, err)
			}
		}
	case cb != nil:
		inner.Completion = cb.call
	}
	return inner
}

// WriteMessages writes msgs like kafka.Writer.WriteMessages. During a
// checkpoint it waits until the process is resumed or restored, or until ctx
// ends (then it returns ctx.Err()). After Close it returns io.ErrClosedPipe.
func (w *Writer) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	n := int64(len(msgs))
	_, err := gatedCall(ctx, &w.gate, io.ErrClosedPipe, func(s *writerState) (struct{}, bool, error) {
		w.inflight.Add(callUnit + n)
		w.cfg.registry.Touch(len(msgs)) // notify.Activity
		err := s.w.WriteMessages(ctx, msgs...)
		if err != nil || !w.async {
			w.inflight.Add(-callUnit - n)
			if err != nil && !w.async {
				w.countInterrupted(err)
			}
		} else {
			// Accepted async records are counted down by Completion.
			w.inflight.Add(-callUnit)
		}
		// A checkpoint that closed that kafka.Writer before it took the
		// records: wait at the gate and write them to the next one.
		again := err == io.ErrClosedPipe && w.state.Load() != s
		return struct{}{}, again, err
	})
	return err
}

// countInterrupted counts the records of a failed sync write that failed
// because a checkpoint interrupted their request.
func (w *Writer) countInterrupted(err error) {
	var we kafka.WriteErrors
	if !errors.As(err, &we) {
		return
	}
	n := 0
	for _, e := range we {
		if e != nil && isInterrupted(e) {
			n++
		}
	}
	w.interruptedRecs.Add(int64(n))
}

// Stats returns the kafka.Writer statistics since the last call, summed over
// the kafka.Writer values the Writer used in that time. Dials counts the
// connections the Writer's transports opened.
func (w *Writer) Stats() kafka.WriterStats {
	w.mu.Lock()
	src := w.statsSrc
	acc := w.acc
	w.acc = kafka.WriterStats{}
	w.mu.Unlock()
	st := src.Stats()
	addStats(&st, acc)
	st.Dials += w.transport.dials.Swap(0)
	st.ClientID = w.ClientID()
	return st
}

// ClientID returns the client id the Writer currently sends to brokers.
func (w *Writer) ClientID() string {
	return w.currentClientID()
}

// Name returns the name the Writer is registered under.
func (w *Writer) Name() string { return w.cfg.name }

// Close flushes pending records like kafka.Writer.Close, unregisters the
// Writer and closes its connections. WriteMessages calls blocked at the gate
// return io.ErrClosedPipe. Records carried across a checkpoint that are still
// waiting for the broker are given up: they are reported as failed to their
// callers (WriteErrors) or to Completion, as kafka-go does for records it
// cannot deliver.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.done)
	s := w.state.Load()
	w.state.Store(&writerState{closed: true})
	if w.closing != nil {
		close(w.closing)
		w.closing = nil
	}
	closeDone := w.closeDone
	w.mu.Unlock()
	w.unregister()

	if s.w != nil {
		w.closeInner(s.w)
		w.absorb(s.w)
	}
	if closeDone != nil {
		w.transport.stopHeld()
		<-closeDone
	}
	if w.cb != nil {
		w.cb.wait(nil) // like kafka.Writer.Close, wait for every Completion
	}
	w.bg.Wait()
	w.transport.shutdown()
	return nil
}

const callUnit = 1 << 40

// records returns how many records kafka-go holds for the Writer.
func (w *Writer) records() int64 { return w.inflight.Load() & (callUnit - 1) }

// closeInner closes a kafka.Writer that the gate keeps new calls away from.
//
// kafka.Writer.Close has a race: a WriteMessages call that passed its
// "closed" check but has not queued its records yet when Close runs creates
// a partition writer that Close does not see, and Close then waits for that
// writer's goroutine forever. So once the kafka.Writer refuses new calls and
// every call that got in has left, Close is called again: it closes such
// partition writers (after flushing them) and lets the first Close return.
func (w *Writer) closeInner(inner *kafka.Writer) {
	closed := make(chan struct{})
	go func() {
		inner.Close()
		close(closed)
	}()
	if inner.Addr != nil {
		// WriteMessages without messages fails with io.ErrClosedPipe
		// once Close has marked the writer closed.
		for inner.WriteMessages(context.Background()) != io.ErrClosedPipe {
			time.Sleep(50 * time.Microsecond)
		}
	}
	for d := 50 * time.Microsecond; w.inflight.Load() >= callUnit; d = min(2*d, 50*time.Millisecond) {
		select {
		case <-closed:
			return
		case <-time.After(d):
		}
	}
	inner.Close()
	<-closed
}

// absorb adds the final statistics of a closed kafka.Writer to the totals.
func (w *Writer) absorb(inner *kafka.Writer) {
	st := inner.Stats()
	w.mu.Lock()
	addStats(&w.acc, st)
	w.mu.Unlock()
}
