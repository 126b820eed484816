package kafkahooks

import (
	"log/slog"
	"time"

	"github.com/kcr-dev/kcr/internal/hookopt"
	"github.com/kcr-dev/kcr/notify"
)

// WriterOpt configures a Writer (NewWriter, NewWriterFromConfig).
type WriterOpt interface {
	applyWriter(*config)
}

// ReaderOpt configures a Reader (NewReader).
type ReaderOpt interface {
	applyReader(*config)
}

// Opt configures a Writer or a Reader. An option that applies to only one
// of them is a WriterOpt or a ReaderOpt instead, so that passing it to the
// other does not compile.
type Opt interface {
	WriterOpt
	ReaderOpt
}

type opt func(*config)

func (o opt) applyWriter(c *config) { o(c) }
func (o opt) applyReader(c *config) { o(c) }

type writerOpt func(*config)

func (o writerOpt) applyWriter(c *config) { o(c) }

type readerOpt func(*config)

func (o readerOpt) applyReader(c *config) { o(c) }

type config struct {
	registry   *notify.Registry
	name       string
	log        *slog.Logger
	clientID   string
	backoffMin time.Duration
	backoffMax time.Duration
	// unflushedOK: WithUnflushedCommits.
	unflushedOK bool
	// handover: WithGroupHandover.
	handover bool
	// offsetsCheckAfter: WithOffsetsCheckAfter.
	offsetsCheckAfter time.Duration
	// commitWait: WithCommitWait.
	commitWait time.Duration
}

// newConfig returns the configuration named defaultName unless an option
// renames it, after apply has applied the options.
func newConfig[O any](defaultName string, opts []O, apply func(O, *config)) config {
	c := config{
		name:       defaultName,
		backoffMin: 100 * time.Millisecond,
		backoffMax: 5 * time.Second,

		offsetsCheckAfter: time.Minute,
		commitWait:        time.Second,
	}
	hookopt.Apply(&c, opts, apply)
	c.registry, c.log = hookopt.Defaults(c.registry, c.log)
	c.log = c.log.With("resource", c.name)
	if c.backoffMax < c.backoffMin {
		c.backoffMax = c.backoffMin
	}
	return c
}

// WithRegistry registers the resource with r instead of notify.Default. Tests
// use it to run checkpoint cycles with (*notify.Registry).Simulate on a
// registry of their own.
func WithRegistry(r *notify.Registry) Opt { return opt(func(c *config) { c.registry = r }) }

// WithName sets the name the resource is registered under; it appears in
// kcr's reports, errors, logs and the image manifest. The default is
// "kafka-writer/<topic>" for a Writer and "kafka-reader/<group>" or
// "kafka-reader/<topic>/<partition>" for a Reader.
func WithName(name string) Opt { return opt(func(c *config) { c.name = name }) }

// WithLogger sets the logger (default slog.Default()). Every record carries
// the attribute resource=<name>.
func WithLogger(l *slog.Logger) Opt { return opt(func(c *config) { c.log = l }) }

// WithClientID sets the base client id. The client id sent to brokers is the
// base id until the first restore, and base + "-" + the first 8 hex digits of
// notify.Event.InstanceID after each restore, so that every restored clone is
// told apart in broker logs, quotas and group descriptions. The default base
// is the ClientID of the template's *kafka.Transport (Writer) or
// ReaderConfig.Dialer (Reader), or kafka.DefaultClientID if that is empty.
func WithClientID(id string) Opt { return opt(func(c *config) { c.clientID = id }) }

// WithRetryBackoff bounds the backoff between resends of records carried
// across a checkpoint, while the broker cannot be reached after a restore.
// Such records are resent until they are acknowledged or the Writer is
// closed; they are never given up on. Default 100ms to 5s.
func WithRetryBackoff(lo, hi time.Duration) WriterOpt {
	return writerOpt(func(c *config) { c.backoffMin, c.backoffMax = lo, hi })
}

// WithOffsetsCheckAfter sets how long after the checkpoint a restore must
// come for a group Reader to check the group's committed offsets before it
// rejoins (default 1 minute, the smallest offsets.retention.minutes: a
// group left empty by the checkpoint cannot lose its offsets to expiry
// sooner). The check costs one OffsetFetch round trip in the after-restore
// hook; the offsets the broker lost are committed again from the image and
// reported (GroupRestore). 0 checks on every restore.
func WithOffsetsCheckAfter(d time.Duration) ReaderOpt {
	return readerOpt(func(c *config) { c.offsetsCheckAfter = d })
}

// WithCommitWait sets how long a group Reader's before-checkpoint hook
// waits for the application to commit records it was handed before the
// checkpoint began (default 1s; 0 does not wait). Their CommitMessages
// calls meet the closed gate; the hook sends them before the kafka.Reader
// leaves the group, so that no copy is handed those records again. The
// wait ends as soon as every record handed out is committed or waiting at
// the gate, so it costs nothing to an application that holds no
// uncommitted records; one that never commits some (or batches them until
// its next FetchMessage returns) pays it at every checkpoint, and those
// records are delivered again after it (RecordsInApp in the report).
// The same wait, at most half the RebalanceTimeout, bounds how long a
// rebalance waits for those commits (see Reader, "Rebalances").
func WithCommitWait(d time.Duration) ReaderOpt {
	return readerOpt(func(c *config) { c.commitWait = max(d, 0) })
}
