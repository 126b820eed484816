package kgohooks

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// GroupTransactSession is a kgo.GroupTransactSession that takes part in kcr
// checkpoints, for consume-transform-produce loops with exactly-once
// delivery. It builds a new kgo.GroupTransactSession after every
// checkpoint.
//
// A checkpoint acts on it like a rebalance acts on kgo's session: a
// transaction that contains records polled before the checkpoint cannot
// commit after it. The application's End then aborts and reports
// committed=false, and the records are polled again from the committed
// offsets by the new group member. A transaction that is open when the
// checkpoint begins gets half the hook's budget to be ended by the
// application (its Produce, Flush and End calls pass the gate); then the
// OpenTxnPolicy applies.
type GroupTransactSession struct {
	*core
}

// NewGroupTransactSession is kgo.NewGroupTransactSession for a session
// registered with notify.Default.
func NewGroupTransactSession(opts ...kgo.Opt) (*GroupTransactSession, error) {
	return NewSession(opts)
}

// NewSession returns a GroupTransactSession built from the kgo options
// kopts, which must set kgo.ConsumerGroup and kgo.TransactionalID. The
// identities change after a restore as for New.
func NewSession(kopts []kgo.Opt, opts ...Opt) (*GroupTransactSession, error) {
	c, err := newCore(kopts, true, opts)
	if err != nil {
		return nil, err
	}
	return &GroupTransactSession{c}, nil
}

// Begin is kgo.GroupTransactSession.Begin. During a checkpoint it waits at
// the gate until the process is resumed or restored, or ctx ends.
func (s *GroupTransactSession) Begin(ctx context.Context) error {
	st, err := s.enter(ctx, &s.calls, newWork)
	if err != nil {
		return err
	}
	defer s.calls.Add(-1)
	s.txnAborted.Store(false)
	if err := st.sess.Begin(); err != nil {
		return err
	}
	s.txnOpen.Store(true)
	return nil
}

// End is kgo.GroupTransactSession.End. It returns committed=false without
// an error when a checkpoint aborted the transaction, or when the
// transaction holds records polled before a checkpoint (it is aborted then):
// the records are polled again, as after a rebalance.
func (s *GroupTransactSession) End(ctx context.Context, commit kgo.TransactionEndTry) (committed bool, err error) {
	if !s.txnOpen.Load() && s.txnAborted.Swap(false) {
		s.handedGen.Store(0)
		return false, nil
	}
	st, err := s.enter(ctx, &s.calls, txnWork)
	if err != nil {
		return false, err
	}
	defer s.calls.Add(-1)
	if g := s.handedGen.Load(); commit && g != 0 && g != st.gen {
		s.cfg.log.Info("aborting a transaction with records polled before a checkpoint; they are polled again")
		commit = kgo.TryAbort
	}
	committed, err = st.sess.End(ctx, commit)
	s.txnOpen.Store(false)
	s.handedGen.Store(0)
	return committed, err
}

// Close is kgo.GroupTransactSession.Close, and unregisters the session.
func (s *GroupTransactSession) Close() {
	s.close(func(st *state) { st.sess.Close() })
}
