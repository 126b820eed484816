package kgohooks

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/quiesce"
	"github.com/kcr-dev/kcr/notify"
)

// shareRun is what one ShareConsumer.BeforeCheckpoint's steps share.
type shareRun struct {
	c     *ShareConsumer
	start time.Time
	s     *shareState // the client's state when the gate closed
	rep   ShareReport
	cp    *ShareCheckpoint
}

// BeforeCheckpoint implements notify.Resource; see docs/share-groups.md. It
// closes the gate, waits for the application to hand back the records it
// holds (or releases them), flushes the acknowledgements, leaves the share
// group and closes the kgo client. A failed step refuses the checkpoint and
// the client goes on, the same member.
func (c *ShareConsumer) BeforeCheckpoint(ctx context.Context) error {
	r := c.gateForCheckpoint()
	if r == nil {
		return nil
	}
	pctx, cancel := share(ctx, 0.2)
	quiesce.WaitZero(pctx, &c.polls) // polls already inside kgo return
	cancel()
	if err := r.settleHeld(ctx); err != nil {
		return r.finish(err)
	}
	if err := r.flushAcks(ctx); err != nil {
		return r.finish(err)
	}
	r.leaveAndClose(ctx)
	return r.finish(nil)
}

// gateForCheckpoint closes the gate, so that new polls wait, and ends
// waiting polls; nil when the consumer is closed or a checkpoint runs.
func (c *ShareConsumer) gateForCheckpoint() *shareRun {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.gate != nil {
		return nil
	}
	c.gate = make(chan struct{})
	s := c.st.Load()
	c.st.Store(s.with(c.gate, false))
	s.cancel() // ends waiting polls, closes Quiescing
	cp := &ShareCheckpoint{RecordsHeld: c.held.Load()}
	return &shareRun{c: c, start: start, s: s, cp: cp,
		rep: ShareReport{Phase: "before-checkpoint", ClientID: c.clientID, Group: c.group, ShareCheckpoint: cp}}
}

// finish stores the run's report and returns err.
func (r *shareRun) finish(err error) error {
	r.rep.CallersBlocked = r.c.blocked.Load()
	r.rep.DurationMS = time.Since(r.start).Milliseconds()
	if err != nil {
		r.cp.Error = err.Error()
		r.c.cfg.log.Warn("checkpoint refused; the share consumer goes on", "err", err)
	} else {
		r.c.cfg.log.Debug("share consumer quiesced", "report", r.rep)
	}
	r.c.reports.Store(r.rep)
	return err
}

// settleHeld waits for the application to poll again, which hands back the
// records it holds, then applies the HeldPolicy to those it still holds.
func (r *shareRun) settleHeld(ctx context.Context) error {
	c := r.c
	wctx, cancel := share(ctx, 0.5)
	if c.cfg.heldWait > 0 {
		cancel()
		wctx, cancel = context.WithTimeout(ctx, c.cfg.heldWait)
	}
	for c.held.Load() > 0 && c.heldGen.Load() == r.s.gen && wctx.Err() == nil {
		select {
		case <-wctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	held := c.held.Load()
	if held == 0 || c.heldGen.Load() != r.s.gen {
		return nil
	}
	if c.cfg.held == RefuseHeld {
		return &notify.CarryError{Records: held, Err: fmt.Errorf("%w: it did not poll again in time (RefuseHeld)", ErrRecordsHeld)}
	}
	// The handler still in flight keeps its records; its later
	// acknowledgements of them change nothing.
	r.s.cl.MarkAcks(kgo.AckRelease)
	r.cp.RecordsReleased = held
	c.cfg.log.Info("released the records the application still held", "records", held)
	return nil
}

// flushAcks sends every acknowledgement to the brokers and waits for their
// answers: an accepted record whose acknowledgement is lost would be
// delivered again when its acquisition lock expires.
func (r *shareRun) flushAcks(ctx context.Context) error {
	fctx, cancel := share(ctx, 0.6)
	defer cancel()
	if err := r.s.cl.FlushAcks(fctx); err != nil {
		return fmt.Errorf("%w: %v", ErrAcksNotFlushed, err)
	}
	r.cp.AcksFlushed = true
	return nil
}

// leaveAndClose leaves the share group, which also releases what kgo
// fetched and did not hand out, closes the kgo client and cuts whatever
// connection is left. A leave that fails (the broker went away) leaves the
// member to expire with group.share.session.timeout.ms; it holds no record.
func (r *shareRun) leaveAndClose(ctx context.Context) {
	c, s := r.c, r.s
	lctx, cancel := share(ctx, 0.8)
	err := s.cl.LeaveGroupContext(lctx)
	cancel()
	r.cp.LeftGroup = err == nil
	if err != nil {
		r.cp.LeaveError = err.Error()
		c.cfg.log.Warn("could not leave the share group; the member expires with its session", "err", err)
		s.dial.CloseAll(true) // the close below must not wait for the broker
	}
	done := make(chan struct{})
	go func() {
		s.cl.Close()
		close(done)
	}()
	cctx, cancel := share(ctx, 0.5)
	select {
	case <-done:
	case <-cctx.Done():
	}
	cancel()
	s.dial.CloseAll(true)
	r.cp.ConnectionsOpen = s.dial.Open()
	c.mu.Lock()
	c.st.Store(s.with(c.gate, true))
	c.mu.Unlock()
}

// AfterRestore implements notify.Resource. A consumer whose checkpoint
// closed its kgo client gets a new one (a new member of the share group),
// with a suffixed client id on a restore; a refused checkpoint goes on with
// the same client. Then the gate opens.
func (c *ShareConsumer) AfterRestore(ctx context.Context, ev notify.Event) error {
	start := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.gate == nil {
		return nil
	}
	s := c.st.Load()
	rs := &ShareRestore{Event: ev.Kind.String()}
	var err error
	next := newShareState(s.cl, s.dial, s.gen)
	if s.torn {
		if ev.Kind == notify.Restore {
			c.clientID = c.baseClientID + "-" + ev.ShortID()
		}
		var cl *kgo.Client
		cl, dial, berr := c.build()
		if berr != nil {
			err = fmt.Errorf("kgohooks: share consumer %s: new kgo client: %w", c.cfg.name, berr)
			next = s.with(make(chan struct{}), true)
			next.closed = true // polls fail with kgo.ErrClientClosed
		} else {
			c.gen++
			next = newShareState(cl, dial, c.gen)
			rs.NewClient = true
		}
	}
	c.st.Store(next)
	close(c.gate)
	c.gate = nil
	c.reports.Store(ShareReport{Phase: "after-restore", ClientID: c.clientID, Group: c.group,
		CallersBlocked: c.blocked.Load(), DurationMS: time.Since(start).Milliseconds(), ShareRestore: rs})
	return err
}
