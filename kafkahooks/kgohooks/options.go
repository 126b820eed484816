package kgohooks

import (
	"log/slog"
	"time"

	"github.com/kcr-dev/kcr/internal/hookopt"
	"github.com/kcr-dev/kcr/notify"
)

// Opt configures a Client (New) or a GroupTransactSession (NewSession).
// Options are values of an interface, as kgo.Opt is; kgo's own options are
// given separately, unchanged. Every option applies to both: the
// transaction options act on a Client built with kgo.TransactionalID and
// are ignored by one without.
type Opt interface {
	apply(*config)
}

type opt func(*config)

func (o opt) apply(c *config) { o(c) }

type config struct {
	registry   *notify.Registry
	name       string
	log        *slog.Logger
	txnID      TxnIDPolicy
	openTxn    OpenTxnPolicy
	backoffMin time.Duration
	backoffMax time.Duration
	held       HeldPolicy    // ShareConsumer only
	heldWait   time.Duration // ShareConsumer only; 0: half the hook budget
}

func newConfig(opts []Opt) config {
	c := config{backoffMin: 50 * time.Millisecond, backoffMax: time.Second}
	hookopt.Apply(&c, opts, Opt.apply)
	c.registry, c.log = hookopt.Defaults(c.registry, c.log)
	return c
}

// WithRegistry registers the client with r instead of notify.Default (the
// default). Tests use it to run cycles with (*notify.Registry).Simulate.
func WithRegistry(r *notify.Registry) Opt { return opt(func(c *config) { c.registry = r }) }

// WithName sets the name the client is registered under (reports, errors,
// logs, the image manifest). The default is "kgo/" and the client id.
func WithName(name string) Opt { return opt(func(c *config) { c.name = name }) }

// WithLogger sets the logger (default slog.Default()). Every record carries
// the attribute resource=<name>.
func WithLogger(l *slog.Logger) Opt { return opt(func(c *config) { c.log = l }) }

// TxnIDPolicy says which transactional id a restored client uses.
type TxnIDPolicy int

const (
	// SuffixTxnID (the default) gives every restored instance the
	// transactional id base + "-" + the first 8 hex digits of its instance
	// id, like its client id. Clones of one image (kcr restore --count N),
	// and an original that went on after --leave-running, then never fence
	// each other: each is its own transactional producer. Use it for clones.
	SuffixTxnID TxnIDPolicy = iota
	// KeepTxnID keeps the configured transactional id after a restore. The
	// restored instance fences every other holder of that id (its epoch is
	// bumped when it initializes): right for a migration, where the old
	// process must stop writing, wrong for clones, which would fence each
	// other in turn. After --leave-running the original keeps its client
	// and the restored copy initializes the id after it, so the original
	// is the one fenced: its transactional calls return kgo's fencing
	// error (see IsFenced), and it must stop and Close.
	KeepTxnID
)

// WithTxnIDPolicy sets what a restore does to kgo.TransactionalID (default
// SuffixTxnID).
func WithTxnIDPolicy(p TxnIDPolicy) Opt { return opt(func(c *config) { c.txnID = p }) }

// OpenTxnPolicy says what the before-checkpoint hook does with a transaction
// the application has begun and not ended. In every case the hook first
// lets the application end it by itself: calls that belong to the open
// transaction (Produce, Flush, End, EndTransaction) pass the closed gate for up to
// half of the hook's budget. Only then does the policy apply.
type OpenTxnPolicy int

const (
	// AbortOpenTxn (the default) aborts the transaction before the dump.
	// Its records are never visible to read_committed consumers; a
	// consume-transform-produce loop processes its input again from the
	// committed offsets. Later calls of that transaction fail or report it
	// aborted: Produce with ErrTxnAbortedByCheckpoint, End with
	// committed=false, EndTransaction(TryCommit) with
	// ErrTxnAbortedByCheckpoint.
	AbortOpenTxn OpenTxnPolicy = iota
	// CommitOpenTxn flushes and commits it (for a GroupTransactSession
	// with the offsets of the records polled so far). Use it only when
	// every record the application produced is a complete unit of work:
	// a batch that is half produced is committed half.
	CommitOpenTxn
	// FailOnOpenTxn makes the checkpoint fail (kcr exits 3, nothing is
	// dumped) with ErrOpenTxn; the application resumes inside its
	// transaction.
	FailOnOpenTxn
)

// WithOpenTxnPolicy sets what a checkpoint does with an open transaction
// (default AbortOpenTxn).
func WithOpenTxnPolicy(p OpenTxnPolicy) Opt { return opt(func(c *config) { c.openTxn = p }) }

// WithRetryBackoff bounds the backoff between attempts of the commits the
// before-checkpoint hook makes, and of the resolution of symbolic start
// offsets of direct partitions. Default 50ms to 1s.
func WithRetryBackoff(lo, hi time.Duration) Opt {
	return opt(func(c *config) { c.backoffMin, c.backoffMax = lo, max(hi, lo) })
}
