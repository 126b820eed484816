package kafkawake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Claims is the wake election of the replicas of one service: a
// single-partition topic that every replica reads from its tail, where a
// sleeping replica that decided to wake first writes a claim. The topic is
// a compare-and-swap register: a claim names the offset of the last record
// of its group its writer had read, and it is valid only if that is the
// last record of the group before it in the log. Two replicas that decide
// at once write claims with the same previous offset: the first in log
// order is valid, and the other, seeing it, stays asleep. Every reader
// applies the same rule to the same log, so all agree on who won.
//
// Each replica writes a hello record when it opens the log, so that its
// first claim names a record every reader has read, and an asleep record
// each time it goes to sleep: a claim is pending from its writing until
// the group has the live members it wanted, its replica wrote again, or
// a bound passed.
type Claims struct {
	cl    *kgo.Client
	topic string
	group string
	self  string
	ver   string // this kcr's version
	log   *slog.Logger

	mu      sync.Mutex
	last    int64   // offset of the last record of the group read; -1: none
	next    int64   // the next offset to read
	valid   []Claim // the valid claims read, newest last (the last hour's)
	changed chan struct{}
}

// Claim is a valid claim: a replica that won the right to wake.
type Claim struct {
	Offset  int64     `json:"offset"`
	At      time.Time `json:"at"`
	Replica string    `json:"replica"`
	// Live is how many members the group had, and Want how many it has
	// once the claim's replica joined: the claim is spent when the group
	// reaches Want live members.
	Live   int    `json:"live"`
	Want   int    `json:"want"`
	Reason string `json:"reason"`
	// Spent: its replica went back to sleep (or started again) since.
	Spent bool `json:"spent,omitempty"`
}

// claimRecord is a record of the claims topic, keyed by group.
type claimRecord struct {
	// V is the format; a reader applies the compare-and-swap to every
	// record of its group, whatever its V.
	V       int    `json:"v"`
	Kind    string `json:"kind"` // "hello", "claim" or "asleep"
	Replica string `json:"replica"`
	Prev    int64  `json:"prev"`
	Live    int    `json:"live,omitempty"`
	Want    int    `json:"want,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Version string `json:"kcr_version,omitempty"`
}

// claimsFormat is the format of the records this kcr writes.
const claimsFormat = 1

// claimsKeep is how far back a replica reads the claims when it opens
// them: claims older than that are spent.
const claimsKeep = time.Hour

// OpenClaims creates the claims topic if it is missing (one partition,
// records kept a day), writes this replica's hello and reads the log up
// to it.
func OpenClaims(ctx context.Context, brokers []string, topic, group, self, version string, log *slog.Logger) (*Claims, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Claims{topic: topic, group: group, self: self, ver: version, log: log, last: -1, changed: make(chan struct{})}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("kcr-standby-claims"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AfterMilli(time.Now().Add(-claimsKeep).UnixMilli())}}),
		kgo.ProducerLinger(0))
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrConfig, brokers, err)
	}
	c.cl = cl
	if err := c.create(ctx); err != nil {
		cl.Close()
		return nil, err
	}
	go c.tail()
	off, err := c.write(ctx, claimRecord{Kind: "hello", Prev: -1, Version: version})
	if err != nil {
		cl.Close()
		return nil, err
	}
	if err := c.ReadTo(ctx, off); err != nil {
		cl.Close()
		return nil, fmt.Errorf("read the claims topic %q up to this replica's hello: %w", topic, err)
	}
	return c, nil
}

// create creates the claims topic if it is missing.
func (c *Claims) create(ctx context.Context) error {
	adm := kadm.NewClient(c.cl)
	day, seg := "86400000", "3600000"
	_, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"retention.ms": &day, "segment.ms": &seg}, c.topic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create the replicas' claims topic %q: %w (create it with one partition, or give --replicas-topic)", c.topic, err)
	}
	return nil
}

// Close closes the client.
func (c *Claims) Close() { c.cl.Close() }

// write writes r (Replica and format set here) and returns its offset.
func (c *Claims) write(ctx context.Context, r claimRecord) (int64, error) {
	r.V, r.Replica = claimsFormat, c.self
	b, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	res := c.cl.ProduceSync(ctx, &kgo.Record{Topic: c.topic, Partition: 0, Key: []byte(c.group), Value: b})
	rec, err := res.First()
	if err != nil {
		return 0, fmt.Errorf("write to the claims topic %q: %w", c.topic, err)
	}
	return rec.Offset, nil
}

// tail reads the topic until the client closes.
func (c *Claims) tail() {
	for {
		fs := c.cl.PollFetches(context.Background())
		if fs.IsClientClosed() {
			return
		}
		fs.EachError(func(_ string, _ int32, err error) {
			c.log.Warn("standby: replicas: reading the claims topic failed; reading on", "topic", c.topic, "err", err)
		})
		fs.EachRecord(c.apply)
	}
}

// apply applies one record of the log: the compare-and-swap.
func (c *Claims) apply(r *kgo.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next = r.Offset + 1
	defer c.notify()
	if string(r.Key) != c.group {
		return
	}
	var cr claimRecord
	if err := json.Unmarshal(r.Value, &cr); err != nil {
		c.log.Warn("standby: replicas: a record of the claims topic is not a claim; it counts as one that lost", "topic", c.topic, "offset", r.Offset, "err", err)
		c.last = r.Offset
		return
	}
	if cr.V > claimsFormat {
		c.log.Warn("standby: replicas: a claim of a newer format (another kcr version); the compare-and-swap still holds", "replica", cr.Replica, "format", cr.V)
	}
	prev := c.last
	c.last = r.Offset
	if cr.Kind == "hello" && cr.Replica != c.self && cr.Version != c.ver {
		c.log.Info("standby: replicas: a replica of another kcr version; they still coordinate", "replica", cr.Replica, "kcr_version", cr.Version)
	}
	if cr.Kind != "claim" {
		// A replica asleep again, or started again: its claims are
		// spent, however briefly it was a member.
		for i := range c.valid {
			if c.valid[i].Replica == cr.Replica {
				c.valid[i].Spent = true
			}
		}
		return
	}
	if cr.Prev != prev {
		return
	}
	c.valid = append(c.valid, Claim{Offset: r.Offset, At: r.Timestamp, Replica: cr.Replica, Live: cr.Live, Want: cr.Want, Reason: cr.Reason})
	for len(c.valid) > 0 && time.Since(c.valid[0].At) > claimsKeep {
		c.valid = c.valid[1:]
	}
}

// notify wakes those waiting for a change; c.mu is held.
func (c *Claims) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Changed is closed at the next record read.
func (c *Claims) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// ReadTo waits until the record at off (an offset of the claims topic)
// was read.
func (c *Claims) ReadTo(ctx context.Context, off int64) error {
	for {
		c.mu.Lock()
		done, ch := c.next > off, c.changed
		c.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Claim writes a claim to wake (live members now, want once woken) and
// reports whether it won: it was valid, read back from the log. prev is
// the Pending (its last record) the decision was made on: a record read
// since makes the claim lose, and the caller decides again.
func (c *Claims) Claim(ctx context.Context, prev int64, live, want int, reason string) (bool, error) {
	off, err := c.write(ctx, claimRecord{Kind: "claim", Prev: prev, Live: live, Want: want, Reason: reason})
	if err != nil {
		return false, err
	}
	if err := c.ReadTo(ctx, off); err != nil {
		return false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.valid {
		if v.Offset == off {
			return true, nil
		}
	}
	return false, nil
}

// Asleep records that this replica sleeps: its claims are spent. It
// returns once it read the record back.
func (c *Claims) Asleep(ctx context.Context) error {
	off, err := c.write(ctx, claimRecord{Kind: "asleep", Prev: -1})
	if err != nil {
		return err
	}
	return c.ReadTo(ctx, off)
}

// Pending are the valid claims not spent at now with live members: the
// group has fewer than they want, and they are younger than bound (a
// replica that won and then failed to join is given up after bound).
// last is the offset of the last record of the group read, for Claim.
func (c *Claims) Pending(now time.Time, live int, bound time.Duration) (pending []Claim, last int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.valid {
		if !v.Spent && live < v.Want && now.Sub(v.At) < bound {
			pending = append(pending, v)
		}
	}
	return pending, c.last
}

// Last is the newest valid claim (ok false: none in the last hour).
func (c *Claims) Last() (Claim, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.valid) == 0 {
		return Claim{}, false
	}
	return c.valid[len(c.valid)-1], true
}
