package kgohooks

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/kcr-dev/kcr/internal/conntrack"
)

var errNoDial = errors.New("kgohooks: option inspection does not dial")

// newCore reads the options with a kgo client that cannot dial, builds the
// first client and registers the hooks.
func newCore(kopts []kgo.Opt, session bool, opts []Opt) (*core, error) {
	// The dial function first, from a client that consumes nothing (a
	// group without topics never joins) and so does not dial. kgo builds it
	// from DialTimeout and DialTLSConfig unless the user gave a Dialer; the
	// probe below cannot keep DialTLSConfig beside its own Dialer.
	dprobe, err := kgo.NewClient(append(slices.Clip(kopts), kgo.ConsumeTopics(), kgo.ConsumePartitions(nil))...)
	if err != nil {
		return nil, err
	}
	userDial, _ := dprobe.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	dprobe.Close()
	// A group consumer's probe still tries to find its coordinator before
	// Close: its refused dials must not reach the user's logger.
	probe, err := kgo.NewClient(append(slices.Clip(kopts), kgo.DialTLSConfig(nil), kgo.Dialer(func(context.Context, string, string) (net.Conn, error) {
		return nil, errNoDial
	}), kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return nil, err
	}
	c := &core{cfg: newConfig(opts), kopts: slices.Clip(kopts), session: session}
	c.dialFn = userDial
	c.baseClientID, _ = probe.OptValue(kgo.ClientID).(string)
	mechs, _ := probe.OptValue(kgo.SASL).([]sasl.Mechanism)
	c.sasl = len(mechs) > 0
	c.baseTxnID, _ = probe.OptValue(kgo.TransactionalID).(string)
	c.group, _ = probe.OptValue(kgo.ConsumerGroup).(string)
	c.baseInstanceID, _ = probe.OptValue(kgo.InstanceID).(string)
	c.serverSide, _ = probe.OptValue(kgo.ServerSideBalancer).(bool)
	parts, _ := probe.OptValue(kgo.ConsumePartitions).(map[string]map[int32]kgo.Offset)
	if b, _ := probe.OptValue(kgo.DisableAutoCommit).(bool); b {
		c.commit = commitManual
	} else if b, _ := probe.OptValue(kgo.AutoCommitMarks).(bool); b {
		c.commit = commitMarks
	}
	c.blockRebalance, _ = probe.OptValue(kgo.BlockRebalanceOnPoll).(bool)
	topics, _ := probe.OptValue(kgo.ConsumeTopics).([]string)
	regex, _ := probe.OptValue(kgo.ConsumeRegex).(bool)
	startOff, _ := probe.OptValue(kgo.ConsumeStartOffset).(kgo.Offset)
	iso, _ := probe.OptValue(kgo.FetchIsolationLevel).(int8) // kgo gives the level as an int8
	c.readCommitted = iso == 1
	c.userAdjust, _ = probe.OptValue(kgo.AdjustFetchOffsetsFn).(adjustFn)
	probe.Close()
	if session && c.group == "" {
		return nil, errors.New("kgohooks: a GroupTransactSession needs kgo.ConsumerGroup")
	}
	if session && c.baseTxnID == "" {
		return nil, errors.New("kgohooks: a GroupTransactSession needs kgo.TransactionalID")
	}
	// Without a group, positions are kept even with no partitions yet:
	// AddConsumePartitions may add some, and the next client needs them.
	if c.group == "" {
		if c.pos, err = newPositions(parts); err != nil {
			return nil, err
		}
		c.pos.readCommitted = c.readCommitted
	}
	if c.group != "" {
		c.marks = newMarks()
	} else if len(topics) > 0 {
		c.tpos = newTopicPositions(startOff)
		if !regex {
			c.topics = topics
		}
	}
	c.clientID, c.txnID, c.instanceID = c.baseClientID, c.baseTxnID, c.baseInstanceID
	if c.cfg.name == "" {
		c.cfg.name = "kgo/" + c.baseClientID
	}
	c.cfg.log = c.cfg.log.With("resource", c.cfg.name)
	cl, sess, dial, err := c.build()
	if err != nil {
		return nil, err
	}
	c.gen = 1
	c.state.Store(newState(cl, sess, dial, 1))
	c.startResolve(cl)
	c.unregister = c.cfg.registry.Register(c.cfg.name, c)
	return c, nil
}

// build creates a kgo client with the user's options and the current
// identity and positions. Called with c.mu held or before c is shared.
func (c *core) build() (*kgo.Client, *kgo.GroupTransactSession, *conntrack.Tracker, error) {
	// kgo dials through a tracker, so that a checkpoint can close the
	// client's connections without closing the client (kgo has no other
	// way). kgo refuses a Dialer beside DialTLSConfig: dialFn does the TLS.
	dial := conntrack.New(c.dialFn, nil)
	opts := append(slices.Clip(c.kopts), kgo.ClientID(c.clientID), kgo.DialTLSConfig(nil), kgo.Dialer(dial.DialContext))
	if c.txnID != "" {
		opts = append(opts, kgo.TransactionalID(c.txnID))
	}
	if c.instanceID != "" {
		opts = append(opts, kgo.InstanceID(c.instanceID))
	}
	if c.pos != nil {
		if exact := c.pos.exact(); len(exact) > 0 {
			opts = append(opts, kgo.ConsumePartitions(exact))
		}
	}
	var starts *groupStarts
	if c.group != "" {
		// Partitions without a commit start at exact offsets kgohooks
		// resolves, so that a checkpoint can pin them (see groupStarts).
		starts = newGroupStarts(c.recorded)
		c.recorded = nil
		opts = append(opts, kgo.AdjustFetchOffsetsFn(c.adjust(starts, c.userAdjust)))
	}
	if c.session {
		s, err := kgo.NewGroupTransactSession(opts...)
		if err != nil {
			return nil, nil, nil, err
		}
		starts.cl.Store(s.Client())
		c.starts = starts
		return s.Client(), s, dial, nil
	}
	cl, err := kgo.NewClient(opts...)
	if err == nil && starts != nil {
		starts.cl.Store(cl)
		c.starts = starts
	}
	return cl, nil, dial, err
}

// startResolve resolves symbolic start offsets of direct partitions in the
// background, as kgo would, and hands the exact ones to cl. Called with
// c.mu held or before c is shared.
func (c *core) startResolve(cl *kgo.Client) {
	if c.pos == nil || c.pos.unresolved() == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.resolving, c.stopResolv = done, cancel
	go func() {
		defer close(done)
		adm := kadm.NewClient(cl)
		for d := c.cfg.backoffMin; ; d = min(2*d, c.cfg.backoffMax) {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			exact, err := c.pos.resolve(rctx, adm)
			rcancel()
			if err == nil {
				if len(exact) > 0 {
					cl.AddConsumePartitions(exact)
				}
				c.mu.Lock()
				c.bgErr = nil
				c.mu.Unlock()
				return
			}
			c.mu.Lock()
			c.bgErr = err
			c.mu.Unlock()
			c.cfg.log.Warn("resolving start offsets of direct partitions", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
	}()
}
