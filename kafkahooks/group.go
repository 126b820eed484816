package kafkahooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/conntrack"
)

// A consumer group that a checkpoint leaves empty pays, on its first join
// after the restore, the broker's group.initial.rebalance.delay.ms (Kafka's
// default: 3000 ms). This file holds what the Reader does about it: the
// diagnostic in the before-checkpoint report, and the hand-over of
// WithGroupHandover, which keeps the group from ever being empty.

// initialDelayConfig is the broker setting that delays an empty group's
// first rebalance.
const initialDelayConfig = "group.initial.rebalance.delay.ms"

// diagnoseTimeout bounds the requests of the empty-group diagnostic, which
// run inside the checkpoint's pause.
const diagnoseTimeout = time.Second

// handoverPoll is how often the hand-over looks at the group while the
// restored member joins.
const handoverPoll = 10 * time.Millisecond

// WithGroupHandover keeps a group reader's membership across a checkpoint,
// so that the group is never empty and a restore does not pay the broker's
// group.initial.rebalance.delay.ms (3 s by default) before its first record.
//
// Before the checkpoint the Reader flushes its commits as usual but does not
// leave the group: it closes its connections first, so that kafka-go's
// LeaveGroup cannot go out. The old member stays in the group, holding its
// partitions, until its session expires (ReaderConfig.SessionTimeout,
// kafka-go's default 30 s). After a restore or resume the new kafka.Reader
// joins as a new member (a fresh member id, so clones never share one), and
// as soon as the broker lists a member other than the old one, the Reader
// removes the old member with a LeaveGroup: the rebalance then completes at
// once, without the initial delay.
//
// The window: a restore more than SessionTimeout after the checkpoint finds
// the old member expired and the group empty, and pays the delay again. The
// cost: while the process is down, other members of the group do not get the
// old member's partitions until its session expires, and their rebalances
// in that time wait for it (up to their rebalance timeout). Nothing is read
// twice because of it: commits are flushed before the checkpoint, as without
// the option. The Reader learns its member id from kafka-go's log calls, so
// the option installs a ReaderConfig.Logger that passes every call on to the
// one configured.
func WithGroupHandover() ReaderOpt {
	return readerOpt(func(c *config) { c.handover = true })
}

// joinedFormat is the format of kafka-go's (v0.4.51) log call that names the
// member id a JoinGroup gave the reader (consumergroup.go, nextGeneration).
const joinedFormat = "Joined group %s as member %s in generation %d"

// memberLog is the ReaderConfig.Logger of a kafka.Reader with
// WithGroupHandover: it remembers the member id of the last join and passes
// every call on.
type memberLog struct {
	next kafka.Logger
	id   atomic.Pointer[string]
}

func (l *memberLog) Printf(format string, args ...any) {
	if format == joinedFormat && len(args) == 3 {
		if id, ok := args[1].(string); ok && id != "" {
			l.id.Store(&id)
		}
	}
	if l.next != nil {
		l.next.Printf(format, args...)
	}
}

// memberID returns the member id of the last join, "" before the first.
func (l *memberLog) memberID() string {
	if l == nil {
		return ""
	}
	if p := l.id.Load(); p != nil {
		return *p
	}
	return ""
}

// adminClient returns a kafka-go Client on the Reader's brokers whose
// connections are tracked; done closes them all (no socket may reach an
// image).
func (r *Reader) adminClient() (cl *kafka.Client, done func()) {
	d := r.baseDialer
	dial := d.DialFunc
	if dial == nil {
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	conns := conntrack.New(dial, nil)
	tr := &kafka.Transport{Dial: conns.DialContext, ClientID: r.currentClientID(), TLS: d.TLS, SASL: d.SASLMechanism}
	cl = &kafka.Client{Addr: kafka.TCP(r.rcfg.Brokers...), Transport: tr, Timeout: 5 * time.Second}
	return cl, func() {
		tr.CloseIdleConnections()
		conns.CloseAll(true)
	}
}

// describeGroup returns the state and members of the Reader's group.
func (r *Reader) describeGroup(ctx context.Context, cl *kafka.Client) (string, []kafka.DescribeGroupsResponseMember, error) {
	res, err := cl.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{r.rcfg.GroupID}})
	if err != nil {
		return "", nil, fmt.Errorf("describing group %s: %w", r.rcfg.GroupID, err)
	}
	if len(res.Groups) != 1 {
		return "", nil, fmt.Errorf("describing group %s: %d groups in the answer", r.rcfg.GroupID, len(res.Groups))
	}
	g := res.Groups[0]
	if g.Error != nil {
		return "", nil, fmt.Errorf("describing group %s: %w", r.rcfg.GroupID, g.Error)
	}
	return g.GroupState, g.Members, nil
}

// initialDelay returns the group coordinator's group.initial.rebalance.delay.ms,
// read once per Reader (DescribeConfigs on the coordinator).
func (r *Reader) initialDelay(ctx context.Context, cl *kafka.Client) (time.Duration, error) {
	if ms := r.delayMS.Load(); ms >= 0 {
		return time.Duration(ms) * time.Millisecond, nil
	}
	fc, err := cl.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: r.rcfg.GroupID, KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err == nil && fc.Error != nil {
		err = fc.Error
	}
	if err == nil && fc.Coordinator == nil {
		err = errors.New("no coordinator in the answer")
	}
	if err != nil {
		return 0, fmt.Errorf("finding the coordinator of group %s: %w", r.rcfg.GroupID, err)
	}
	c := fc.Coordinator
	res, err := cl.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{
		Addr: kafka.TCP(net.JoinHostPort(c.Host, strconv.Itoa(c.Port))),
		Resources: []kafka.DescribeConfigRequestResource{{
			ResourceType: kafka.ResourceTypeBroker, ResourceName: strconv.Itoa(c.NodeID), ConfigNames: []string{initialDelayConfig},
		}},
	})
	if err != nil {
		return 0, fmt.Errorf("reading %s of broker %d: %w", initialDelayConfig, c.NodeID, err)
	}
	for _, res := range res.Resources {
		if res.Error != nil {
			return 0, fmt.Errorf("reading %s of broker %d: %w", initialDelayConfig, c.NodeID, res.Error)
		}
		for _, e := range res.ConfigEntries {
			if e.ConfigName != initialDelayConfig {
				continue
			}
			ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil || ms < 0 {
				return 0, fmt.Errorf("broker %d: %s is %q, not a number of milliseconds", c.NodeID, initialDelayConfig, e.ConfigValue)
			}
			r.delayMS.Store(ms)
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	return 0, fmt.Errorf("broker %d did not return %s", c.NodeID, initialDelayConfig)
}

// groupDiag is what the broker said about the group as a checkpoint began.
type groupDiag struct {
	alone bool          // no member, or one with this Reader's client id: leaving empties the group
	delay time.Duration // the coordinator's group.initial.rebalance.delay.ms, if alone
	err   error
}

// diagnoseGroup asks the broker whether this Reader is the group's only
// member, and if so for the coordinator's initial rebalance delay. It runs
// while the checkpoint closes the kafka.Reader (so that it adds nothing to
// the pause); the caller must receive the answer, which comes within
// diagnoseTimeout, with the client's connections closed.
func (r *Reader) diagnoseGroup(ctx context.Context) <-chan groupDiag {
	ch := make(chan groupDiag, 1)
	clientID := r.currentClientID()
	go func() {
		start := time.Now()
		ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
		defer cancel()
		cl, done := r.adminClient()
		var d groupDiag
		_, members, err := r.describeGroup(ctx, cl)
		if err == nil {
			d.alone = len(members) == 0 || (len(members) == 1 && members[0].ClientID == clientID)
			if d.alone {
				d.delay, err = r.initialDelay(ctx, cl)
			}
		}
		d.err = err
		done()
		r.cfg.log.Debug("kafka reader asked the broker about the group", "alone", d.alone, "delay", d.delay, "err", err, "duration", time.Since(start))
		ch <- d
	}()
	return ch
}

// warnEmptyGroup fills in gc's initial-delay fields when the checkpoint
// left the group empty on a broker that delays an empty group's first join.
func (r *Reader) warnEmptyGroup(gc *GroupCheckpoint, d groupDiag) {
	switch {
	case d.err != nil:
		gc.DiagnoseError = d.err.Error()
	case d.alone && d.delay > 0:
		gc.GroupEmpty = true
		gc.InitialRebalanceDelayMS = d.delay.Milliseconds()
		gc.Warning = fmt.Sprintf("group %s is empty after this checkpoint: the broker holds a restored member's first join for %s=%d ms before it gets partitions (kafkahooks.WithGroupHandover keeps the membership across a checkpoint and avoids the wait)",
			r.rcfg.GroupID, initialDelayConfig, d.delay.Milliseconds())
	}
}

// startHandover removes the members in old from the group once another
// member is in it; called with r.mu held, after a restore or resume.
func (r *Reader) startHandover(old []string) {
	timeout := r.sessionTimeout() + 5*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	done := make(chan struct{})
	r.hoStop, r.hoDone = cancel, done
	go func() {
		defer close(done)
		defer cancel()
		start := time.Now()
		left, res, err := r.handover(ctx, old)
		r.mu.Lock()
		r.kept = append(r.kept, left...) // still in the group: the next restore tries again
		r.mu.Unlock()
		r.handovers.Store(&HandoverResult{Old: old, Result: res, DurationMS: time.Since(start).Milliseconds(), Err: errString(err)})
		r.cfg.log.Debug("kafka reader group hand-over", "old_members", old, "result", res, "duration", time.Since(start), "err", err)
	}()
}

// Results of a hand-over (HandoverResult.Result).
const (
	HandoverDone     = "handed-over" // the old members left after a new one joined
	HandoverExpired  = "expired"     // the old members were gone already (their session expired)
	HandoverCanceled = "canceled"    // a checkpoint or Close came first; the old members are still in the group
)

// handover waits until the group lists a member not in old, then removes
// the old members still in it. It returns the old members it left in the
// group.
func (r *Reader) handover(ctx context.Context, old []string) (left []string, result string, err error) {
	cl, done := r.adminClient()
	defer done()
	tick := time.NewTicker(handoverPoll)
	defer tick.Stop()
	var lastErr error
	for {
		_, members, err := r.describeGroup(ctx, cl)
		if err == nil {
			var present []string
			others := 0
			for _, m := range members {
				if slices.Contains(old, m.MemberID) {
					present = append(present, m.MemberID)
				} else {
					others++
				}
			}
			switch {
			case len(present) == 0:
				return nil, HandoverExpired, nil
			case others > 0:
				if err := r.leave(ctx, cl, present); err != nil {
					return present, HandoverCanceled, err
				}
				return nil, HandoverDone, nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return old, HandoverCanceled, lastErr
		case <-tick.C:
		}
	}
}

// leave removes members from the group; an already unknown member is fine.
func (r *Reader) leave(ctx context.Context, cl *kafka.Client, members []string) error {
	req := &kafka.LeaveGroupRequest{GroupID: r.rcfg.GroupID}
	for _, m := range members {
		req.Members = append(req.Members, kafka.LeaveGroupRequestMember{ID: m})
	}
	res, err := cl.LeaveGroup(ctx, req)
	if err == nil {
		err = res.Error
		for _, m := range res.Members {
			if m.Error != nil && !errors.Is(m.Error, kafka.UnknownMemberId) && err == nil {
				err = m.Error
			}
		}
	}
	if errors.Is(err, kafka.UnknownMemberId) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("removing the old members %v from group %s: %w", members, r.rcfg.GroupID, err)
	}
	return nil
}

// stopHandover ends a hand-over in progress and waits for it (its
// connections are closed when it returns).
func (r *Reader) stopHandover() {
	r.mu.Lock()
	stop, done := r.hoStop, r.hoDone
	r.hoStop, r.hoDone = nil, nil
	r.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// sessionTimeout is the group session timeout kafka-go uses.
func (r *Reader) sessionTimeout() time.Duration {
	if r.rcfg.SessionTimeout > 0 {
		return r.rcfg.SessionTimeout
	}
	return 30 * time.Second // kafka-go's default
}

// HandoverResult is the outcome of WithGroupHandover's last hand-over
// (Reader.Handover).
type HandoverResult struct {
	Old        []string `json:"old_members"` // member ids kept across the checkpoint
	Result     string   `json:"result"`      // HandoverDone, HandoverExpired or HandoverCanceled
	DurationMS int64    `json:"duration_ms"` // from the restore to the result
	Err        string   `json:"error,omitempty"`
}

// Handover returns the outcome of the last hand-over (WithGroupHandover),
// and false while none has finished.
func (r *Reader) Handover() (HandoverResult, bool) {
	p := r.handovers.Load()
	if p == nil {
		return HandoverResult{}, false
	}
	return *p, true
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
