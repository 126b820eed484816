package kgohooks

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Client is a kgo.Client that takes part in kcr checkpoints: it has the
// kgo.Client methods services call, behaves like kgo outside checkpoints,
// and builds a new kgo.Client after every restore. A resume keeps the same
// kgo.Client, reconnected, except for a group consumer that left its group
// (a checkpoint without --leave-running whose dump failed). See the package
// documentation for what happens before and after a checkpoint.
type Client struct {
	*core
}

// NewClient is kgo.NewClient for a client registered with notify.Default.
// It takes the same options and returns kgo's error for invalid ones.
func NewClient(opts ...kgo.Opt) (*Client, error) { return New(opts) }

// New returns a Client built from the kgo options kopts, registered with
// the registry of WithRegistry (default notify.Default).
//
// kgo.ClientID (default "kgo") and kgo.TransactionalID are the base
// identities: after each restore the client id is base + "-" + the first 8
// hex digits of notify.Event.InstanceID, and so is the transactional id
// unless WithTxnIDPolicy(KeepTxnID). Start offsets of kgo.ConsumePartitions
// that name no record (AtStart, AtEnd, Relative, AfterMilli) are resolved to
// exact offsets by the Client, at once, in the background; LookbackOffset,
// RewindOffset and AtCommitted are refused there.
func New(kopts []kgo.Opt, opts ...Opt) (*Client, error) {
	c, err := newCore(kopts, false, opts)
	if err != nil {
		return nil, err
	}
	return &Client{c}, nil
}

// CommitRecords is kgo.Client.CommitRecords. A record handed out before a
// checkpoint whose commit would move its partition back is left out (see
// the package documentation); if none is left, it returns nil.
func (c *Client) CommitRecords(ctx context.Context, rs ...*kgo.Record) error {
	s, err := c.enter(ctx, &c.calls, commitReq)
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	if c.marks != nil {
		if rs = c.marks.keep(rs); len(rs) == 0 {
			return nil
		}
	}
	c.cfg.registry.Touch(len(rs)) // notify.Activity
	return s.cl.CommitRecords(ctx, rs...)
}

// MarkCommitRecords is kgo.Client.MarkCommitRecords, with the rule of
// CommitRecords for records handed out before a checkpoint.
func (c *Client) MarkCommitRecords(rs ...*kgo.Record) {
	s, err := c.enter(context.Background(), &c.calls, commitReq)
	if err != nil {
		return
	}
	defer c.calls.Add(-1)
	if c.marks != nil {
		if rs = c.marks.keep(rs); len(rs) == 0 {
			return
		}
	}
	s.cl.MarkCommitRecords(rs...)
}

// CommitUncommittedOffsets is kgo.Client.CommitUncommittedOffsets on the
// current kgo client (whose polls are all this side of the last checkpoint).
func (c *Client) CommitUncommittedOffsets(ctx context.Context) error {
	s, err := c.enter(ctx, &c.calls, commitReq)
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	return s.cl.CommitUncommittedOffsets(ctx)
}

// CommitMarkedOffsets is kgo.Client.CommitMarkedOffsets on the current kgo
// client.
func (c *Client) CommitMarkedOffsets(ctx context.Context) error {
	s, err := c.enter(ctx, &c.calls, commitReq)
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	return s.cl.CommitMarkedOffsets(ctx)
}

// UncommittedOffsets is kgo.Client.UncommittedOffsets of the current kgo
// client.
func (c *Client) UncommittedOffsets() map[string]map[int32]kgo.EpochOffset {
	return c.state.Load().cl.UncommittedOffsets()
}

// BeginTransaction is kgo.Client.BeginTransaction. During a checkpoint it
// waits at the gate (it starts new work); it returns an error only for
// kgo's reasons or when ctx ends.
func (c *Client) BeginTransaction(ctx context.Context) error {
	s, err := c.enter(ctx, &c.calls, newWork)
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	c.txnAborted.Store(false)
	if err := s.cl.BeginTransaction(); err != nil {
		return err
	}
	c.txnOpen.Store(true)
	return nil
}

// EndTransaction is kgo.Client.EndTransaction (flush first to commit, as
// with kgo). It passes the closed gate of a checkpoint that waits for the
// open transaction. If the checkpoint ended the transaction (see
// OpenTxnPolicy), a TryCommit returns ErrTxnAbortedByCheckpoint when it was
// aborted and nil when the checkpoint committed it.
func (c *Client) EndTransaction(ctx context.Context, commit kgo.TransactionEndTry) error {
	if !c.txnOpen.Load() && c.txnAborted.Swap(false) {
		if commit {
			return ErrTxnAbortedByCheckpoint
		}
		return nil
	}
	s, err := c.enter(ctx, &c.calls, txnWork)
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	err = s.cl.EndTransaction(ctx, commit)
	c.txnOpen.Store(false)
	return err
}

// AbortBufferedRecords is kgo.Client.AbortBufferedRecords, for aborting a
// transaction; it passes the gate like EndTransaction.
func (c *Client) AbortBufferedRecords(ctx context.Context) error {
	s, err := c.enter(ctx, &c.calls, txnWork)
	if err != nil {
		return err
	}
	defer c.calls.Add(-1)
	return s.cl.AbortBufferedRecords(ctx)
}

// AddConsumePartitions is kgo.Client.AddConsumePartitions; symbolic start
// offsets are resolved to exact ones first, as in New.
func (c *Client) AddConsumePartitions(partitions map[string]map[int32]kgo.Offset) error {
	if c.pos == nil {
		c.state.Load().cl.AddConsumePartitions(partitions)
		return nil
	}
	if err := c.pos.add(partitions); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state.Load()
	if s.gate != nil || s.closed {
		return nil // the next client takes them
	}
	exact := map[string]map[int32]kgo.Offset{}
	for t, ps := range partitions {
		for p, o := range ps {
			if at, _, _ := classify(o); at >= 0 {
				put(exact, tp{t, p}, kgo.NewOffset().At(at))
			}
		}
	}
	s.cl.AddConsumePartitions(exact)
	if c.resolving == nil || chanClosed(c.resolving) {
		c.startResolve(s.cl)
	}
	return nil
}

// RemoveConsumePartitions is kgo.Client.RemoveConsumePartitions.
func (c *Client) RemoveConsumePartitions(partitions map[string][]int32) {
	if c.pos != nil {
		c.pos.remove(partitions)
	}
	c.state.Load().cl.RemoveConsumePartitions(partitions)
}

func chanClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Close is kgo.Client.Close (it leaves the group; buffered records fail
// with kgo.ErrClientClosed, so Flush first). It also unregisters the
// Client; callers waiting at the gate get kgo.ErrClientClosed.
func (c *Client) Close() {
	c.close(func(s *state) { s.cl.Close() })
}

// CloseAllowingRebalance is kgo.Client.CloseAllowingRebalance: AllowRebalance,
// then Close.
func (c *Client) CloseAllowingRebalance() {
	c.held.Store(false)
	c.close(func(s *state) { s.cl.CloseAllowingRebalance() })
}
