package kafkastandby

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// Decisions of a replica (Config.Replicas): why it is awake or asleep,
// in its Status and told a ReplicaObserver.
const (
	// Awake: it started cold, or was woken by hand.
	DecisionStarted = "started"
	// Woken because the group had fewer live members than --min-wake and
	// work waited, and its claim won.
	DecisionWokenByLag = "woken_by_lag"
	// Woken because the live members did not keep up: the oldest
	// unprocessed record was older than --scale-up-after.
	DecisionScaledUp = "scaled_up"
	// Asleep: the live members keep up; their work is not its lag.
	DecisionKeptAsleep = "kept_asleep_others_keep_up"
	// Asleep: another replica won the claim and is waking, or the group
	// has not yet had --scale-up-after to show the last wake's effect.
	DecisionWaitingForOther = "kept_asleep_other_waking"
	// Asleep: no work at all.
	DecisionIdle = "asleep_no_work"
)

// ReplicaStatus is a replica's last decision: standby's ReplicaStatus.
type ReplicaStatus struct {
	ID          string
	Decision    string
	Why         string
	At          time.Time
	Live        int
	Lag         int64
	OldestAgeMS float64
}

// Timing of the replicas' decisions.
const (
	// claimBound: a replica that won a claim and has not joined the group
	// within it (it failed, or its host is gone) is given up, and another
	// may claim.
	claimBound = 30 * time.Second
	// replicaRetry: the wait after a failed reading of the group.
	replicaRetry = time.Second
)

// Replica is the Kafka wake of one replica among several of a
// service, each under its own kcr standby with the same group: it wakes
// the replica only when the group lacks it (package doc of kafkawake,
// Claims; docs/standby.md, "Replicas").
type Replica struct {
	replicaGroup
	claims *kafkawake.Claims
	o      *Config

	mu        sync.Mutex
	st        ReplicaStatus
	live      int       // live members at the last reading
	changedAt time.Time // when live last changed
	// idle: no record waited in the group at the last busy (the group
	// hold's groupIdle).
	idle atomic.Bool
}

func newReplica(ctx context.Context, o *Config, k replicaGroup) (*Replica, error) {
	id, err := replicaID(o.ImageDir)
	if err != nil {
		return nil, err
	}
	var key []byte
	if o.ReplicasKeyFile != "" {
		if key, err = readReplicasKey(o.ReplicasKeyFile); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadOption, err)
		}
	}
	// Bounded: a broker that stops answering now must not hang the start.
	octx, cancel := context.WithTimeout(ctx, max(2*o.BrokerTimeout, 10*time.Second))
	defer cancel()
	c, err := kafkawake.OpenClaims(octx, kafkawake.ClaimsConfig{Brokers: o.Brokers, Topic: o.ReplicasTopic, Group: k.groupID(),
		Self: id, Version: o.Version, Key: key, Logger: o.Logger, Opts: o.kafkaOpts})
	if err != nil {
		return nil, fmt.Errorf("--replicas: %w", err)
	}
	r := &Replica{replicaGroup: k, claims: c, o: o, changedAt: time.Now(), live: -1}
	r.st = ReplicaStatus{ID: id, Decision: DecisionStarted, Why: "started", At: time.Now()}
	return r, nil
}

// replicaID names this start of the replica: host and image directory
// for people, and a random nonce, so that two starts (two hostNetwork
// pods of one node, which share the host name and the image directory's
// path) never share a name, and nobody who cannot read the claims topic
// can guess it to spend its claims.
func replicaID(imageDir string) (string, error) {
	host, _ := os.Hostname()
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", err
	}
	id := fmt.Sprintf("%s:%s#%x", host, imageDir, nonce)
	if len(id) > 200 || strings.ContainsFunc(id, func(r rune) bool { return !unicode.IsPrint(r) }) {
		id = fmt.Sprintf("%.120q#%x", host+":"+imageDir, nonce) // readers count printable names only
	}
	return id, nil
}

// minReplicasKey is the shortest --replicas-key-file key.
const minReplicasKey = 16

// readReplicasKey reads the replicas' shared key (surrounding space
// dropped), as the Kafka files are read.
func readReplicasKey(file string) ([]byte, error) {
	b, err := readKafkaFile("--replicas-key-file", file)
	if err != nil {
		return nil, err
	}
	if b = bytes.TrimSpace(b); len(b) < minReplicasKey {
		return nil, fmt.Errorf("--replicas-key-file %s: %d bytes, want %d at least: write a random key into it (head -c 32 /dev/urandom | base64)", file, len(b), minReplicasKey)
	}
	return b, nil
}

func (r *Replica) Close() {
	r.Gone("kcr standby stops")
	r.claims.Close()
	r.replicaGroup.Close()
}

// goneBound bounds the write of Gone: a broker that does not answer must
// not hold up a stop or a restart.
const goneBound = 2 * time.Second

// Gone spends this replica's claims at once (an asleep record), when its
// service will not join the group for them: kcr standby stops, or the
// service died. The other replicas then decide without waiting claimBound
// for it.
func (r *Replica) Gone(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), goneBound)
	defer cancel()
	if err := r.claims.Asleep(ctx); err != nil {
		r.o.Logger.Warn("standby: replicas: recording in the claims topic that this replica's service is gone failed; the others wait for its claims' bound", "why", why, "err", err)
		return
	}
	r.o.Logger.Info("standby: replicas: this replica's claims released", "why", why)
}

// Status is the replica's last decision.
func (r *Replica) Status() ReplicaStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

// note records a decision, and logs and counts it when it changed.
func (r *Replica) note(decision, why string, live int, b kafkawake.Backlog) {
	now := time.Now()
	r.mu.Lock()
	changed := r.st.Decision != decision
	r.st = ReplicaStatus{ID: r.st.ID, Decision: decision, Why: why, At: now, Live: live, Lag: b.Records, OldestAgeMS: ms(b.Age(now))}
	r.mu.Unlock()
	if !changed {
		return
	}
	r.o.Logger.Info("standby: replica "+decision, "why", why, "live_members", live, "lag", b.Records, "oldest_age_ms", ms(b.Age(now)))
	if ro, ok := r.o.Observer.(ReplicaObserver); ok {
		ro.ReplicaDecision(decision)
	}
}

// Started records that the replica runs for another reason than a claim
// (a wake of its own is its claims).
func (r *Replica) Started(by, why string) {
	if by == r.Name() {
		return
	}
	r.note(DecisionStarted, why, 0, kafkawake.Backlog{})
}

// members reads the group's live members, and notes when they last
// changed: their number, or a rebalance (the last replica added has no
// partitions yet: its effect is not seen).
func (r *Replica) members(ctx context.Context) (int, error) {
	n, stable, err := r.replicaGroup.members(ctx)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	if n != r.live || !stable {
		r.live, r.changedAt = n, time.Now()
	}
	r.mu.Unlock()
	return n, nil
}

// busy: pending work keeps the replica awake if it is the group's last
// live member, or if the live members do not keep up (it would be woken
// again at once: a replica just woken to help is idle while its join
// waits for the group). Otherwise the others take the work of the
// partitions it gives up.
func (r *Replica) Busy(ctx context.Context) (string, error) {
	why, err := r.replicaGroup.Busy(ctx)
	r.idle.Store(why == "" && err == nil)
	if why == "" || err != nil || strings.HasPrefix(why, blindWhy) {
		return why, err
	}
	live, err := r.members(ctx)
	if err != nil || live <= 1 {
		return why, nil
	}
	b, err := r.backlog(ctx)
	if err != nil {
		return why, nil
	}
	if age := b.Age(time.Now()); age > r.o.ScaleUpAfter {
		return fmt.Sprintf("the %d live members do not keep up: oldest unprocessed record %v old (--scale-up-after %v)", live, age.Round(time.Millisecond), r.o.ScaleUpAfter), nil
	}
	return "", nil
}

// wait returns once this replica won a claim to wake: the group has fewer
// live members than --min-wake and work waits, or its live members do not
// keep up. ctx ends it.
func (r *Replica) Wait(ctx context.Context) error {
	// The claim that woke it last (if any) is spent, however briefly it
	// was a member.
	if err := r.claims.Asleep(ctx); err != nil && ctx.Err() == nil {
		r.o.Logger.Warn("standby: replicas: recording the sleep in the claims topic failed", "err", err)
	}
	for ctx.Err() == nil {
		live, err := r.members(ctx)
		if err != nil {
			r.o.Logger.Warn("standby: replicas: reading the group failed; trying again", "group", r.groupID(), "err", err)
			sleepCtx(ctx, replicaRetry)
			continue
		}
		var won bool
		if live < r.o.MinWake {
			won, err = r.fromZero(ctx, live)
		} else {
			won, err = r.scaleUp(ctx, live)
		}
		if err != nil && ctx.Err() == nil {
			r.o.Logger.Warn("standby: replicas: deciding failed; trying again", "group", r.groupID(), "err", err)
			sleepCtx(ctx, replicaRetry)
		}
		if won {
			return nil
		}
	}
	return ctx.Err()
}

// fromZero is the wait of a group with fewer live members than
// --min-wake: the first records wake one replica (each claim adds one
// until --min-wake), and the others stay asleep.
func (r *Replica) fromZero(ctx context.Context, live int) (bool, error) {
	changed := r.claims.Changed()
	pending, prev := r.claims.Pending(time.Now(), live, claimBound)
	if live+len(pending) >= r.o.MinWake {
		r.note(DecisionWaitingForOther, fmt.Sprintf("replica %s won the claim to wake and is joining", pending[len(pending)-1].Replica), live, kafkawake.Backlog{})
		select {
		case <-ctx.Done():
		case <-changed:
		case <-time.After(replicaRetry):
		}
		return false, nil
	}
	r.note(DecisionIdle, "no work, and no other replica runs", live, kafkawake.Backlog{})
	// Wait for work; a claim of another replica ends the wait too.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-changed:
			cancel()
		case <-wctx.Done():
		}
	}()
	if err := r.replicaGroup.Wait(wctx); err != nil {
		return false, nil
	}
	// Work: a member may have joined meanwhile (a replica without
	// --replicas, say); then the scale-up rule decides.
	if now, err := r.members(ctx); err != nil || now != live {
		return false, err
	}
	why := fmt.Sprintf("work waits and the group has %d live members (--min-wake %d)", live, r.o.MinWake)
	won, err := r.claims.Claim(ctx, prev, live, live+len(pending)+1, why)
	if won {
		r.note(DecisionWokenByLag, why, live, kafkawake.Backlog{})
	}
	return won, err
}

// scaleUp is the wait of a group whose live members run: it wakes this
// replica when the oldest unprocessed record is older than
// --scale-up-after, no other replica is waking, and the last change of
// the group's members is --scale-up-after old (its effect is seen).
func (r *Replica) scaleUp(ctx context.Context, live int) (bool, error) {
	every := min(max(r.o.ScaleUpAfter/5, 200*time.Millisecond), 2*time.Second)
	b, err := r.backlog(ctx)
	if err != nil {
		return false, err
	}
	now := time.Now()
	r.mu.Lock()
	settled := now.Sub(r.changedAt) >= r.o.ScaleUpAfter
	r.mu.Unlock()
	age := b.Age(now)
	pending, prev := r.claims.Pending(now, live, claimBound)
	var why string
	switch {
	case len(pending) > 0:
		r.note(DecisionWaitingForOther, fmt.Sprintf("replica %s won the claim to wake and is joining", pending[len(pending)-1].Replica), live, b)
	case age <= r.o.ScaleUpAfter:
		r.note(DecisionKeptAsleep, fmt.Sprintf("%d live members keep up: oldest unprocessed record %v old (--scale-up-after %v)", live, age.Round(time.Millisecond), r.o.ScaleUpAfter), live, b)
	case !settled:
		r.note(DecisionWaitingForOther, "the group's members changed or rebalanced less than --scale-up-after ago: waiting to see the effect", live, b)
	default:
		why = fmt.Sprintf("%d live members do not keep up: oldest unprocessed record %v old (> --scale-up-after %v), lag %d", live, age.Round(time.Millisecond), r.o.ScaleUpAfter, b.Records)
	}
	if why == "" {
		sleepCtx(ctx, every)
		return false, nil
	}
	won, err := r.claims.Claim(ctx, prev, live, live+1, why)
	if won {
		r.note(DecisionScaledUp, why, live, b)
	}
	return won, err
}

// AbandonsCheckpoint: its wait records this replica asleep and may claim
// a wake in the claims topic, not for a copy that may run on.
func (r *Replica) AbandonsCheckpoint() bool { return false }
