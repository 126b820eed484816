package kafkawake

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

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
// each time it goes to sleep: a claim is pending from its reading until
// the group has the live members it wanted, its replica slept again, or
// a bound passed. An asleep record is a compare-and-swap too (its writer
// writes it again on a newer reading), and a replica's name is new at
// each start, so that its one hello counts once: a record replayed by
// someone who can read and write the topic, signed as it is, counts no
// more (its previous offset is not the last, or its hello was seen).
//
// Only well-formed records of the group count in the compare-and-swap
// (with a Key, only those it signed): junk, records of other groups and
// records a writer without the key forged change nothing and wake no
// waiting replica. A claim's time is when this reader read it (for the
// records read when the log opens, its broker timestamp, never later than
// now), so a writer's clock or a timestamp it chose cannot make a claim
// last longer than the bound its readers give it.
type Claims struct {
	cl    *kgo.Client
	topic string
	group string
	self  string
	ver   string // this kcr's version
	key   []byte
	log   *slog.Logger

	mu      sync.Mutex
	last    int64   // offset of the last record of the group counted; -1: none
	next    int64   // the next offset to read
	hello   int64   // offset of this replica's hello; -1 until known
	valid   []Claim // the valid claims read, newest last (the last hour's, claimsMax at most)
	junk    int     // records of the group that did not count
	junkLog time.Time
	hellos  map[string]bool // the replicas whose hello counted
	helloQ  []string        // hellos' names, oldest first (claimsMaxHellos)
	asleep  int64           // offset of this replica's last asleep that counted
	changed chan struct{}   // closed at a record that counts
	read    chan struct{}   // closed at every record
}

// Claim is a valid claim: a replica that won the right to wake.
type Claim struct {
	Offset int64 `json:"offset"`
	// At is when the claim was read (see Claims).
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
	// well-formed record of its group, whatever its V.
	V       int    `json:"v"`
	Kind    string `json:"kind"` // "hello", "claim" or "asleep"
	Replica string `json:"replica"`
	Prev    int64  `json:"prev"`
	Live    int    `json:"live,omitempty"`
	Want    int    `json:"want,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Version string `json:"kcr_version,omitempty"`
	// At is when a hello was written (Unix ms, its writer's clock).
	At int64 `json:"at,omitempty"`
}

// claimsFormat is the format of the records this kcr writes.
const claimsFormat = 1

// Bounds of the claims.
const (
	// claimsKeep is how far back a replica reads the claims when it
	// opens them: claims older than that are spent.
	claimsKeep = time.Hour
	// claimsMax bounds the valid claims kept (the newest).
	claimsMax = 256
	// claimsMaxRecord bounds a record's value; claimsMaxName a replica's
	// name, claimsMaxText a reason or version.
	claimsMaxRecord = 4096
	claimsMaxName   = 256
	claimsMaxText   = 1024
	// claimsMaxStep bounds how many replicas one claim may want beyond
	// the live members.
	claimsMaxStep = 64
	// claimsMaxHellos bounds the names of the replicas whose hello
	// counted, kept to tell a replayed hello.
	claimsMaxHellos = 4096
	// claimsAsleepTries bounds the writes of an asleep record that each
	// came after another record of the group.
	claimsAsleepTries = 10
	// claimsHelloSkew bounds the distance between a hello's At and its
	// broker timestamp: a replay later than that does not count for any
	// reader, and one sooner finds its original in every reader's reading
	// (claimsKeep back), so all readers agree on it.
	claimsHelloSkew = 10 * time.Minute
	// macHeader carries a record's HMAC-SHA256 when the replicas share a
	// key.
	macHeader = "kcr-mac"
)

// ClaimsConfig configures OpenClaims.
type ClaimsConfig struct {
	// Brokers are the bootstrap brokers (required).
	Brokers []string
	// Topic is the claims topic; Group the service's consumer group,
	// the key of its records (both required).
	Topic, Group string
	// Self is this replica's name, unique among the group's replicas.
	Self string
	// Version is this kcr's version, in its hello.
	Version string
	// Key, if set, signs the records written (HMAC-SHA256) and leaves
	// out of the compare-and-swap every record not signed with it.
	Key []byte
	// Logger receives the claims' records (default slog.Default()).
	Logger *slog.Logger
	// Opts are added to the client's kgo options: how to reach the
	// brokers (kgo.DialTLSConfig, kgo.SASL). None: PLAINTEXT.
	Opts []kgo.Opt
}

// OpenClaims creates the claims topic if it is missing (one partition,
// records kept a day, stamped by the broker), writes this replica's hello
// and reads the log up to it.
func OpenClaims(ctx context.Context, cfg ClaimsConfig) (*Claims, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Claims{topic: cfg.Topic, group: cfg.Group, self: cfg.Self, ver: cfg.Version, key: cfg.Key, log: log,
		last: -1, hello: -1, asleep: -1, hellos: map[string]bool{}, changed: make(chan struct{}), read: make(chan struct{})}
	// The topic exists before the consuming client starts: one that
	// looked it up missing retried on its metadata schedule, and several
	// replicas starting together (one creating it) timed out reading
	// their hello.
	if err := createClaims(ctx, cfg); err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID("kcr-standby-claims"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cfg.Topic: {0: kgo.NewOffset().AfterMilli(time.Now().Add(-claimsKeep).UnixMilli())}}),
		kgo.ProducerLinger(0)}, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: --brokers %v: %v", ErrConfig, cfg.Brokers, err)
	}
	c.cl = cl
	go c.tail()
	off, err := c.write(ctx, claimRecord{Kind: "hello", Prev: -1, Version: cfg.Version, At: time.Now().UnixMilli()})
	if err != nil {
		cl.Close()
		return nil, err
	}
	c.mu.Lock()
	c.hello = off
	c.mu.Unlock()
	if err := c.ReadTo(ctx, off); err != nil {
		cl.Close()
		return nil, fmt.Errorf("read the claims topic %q up to this replica's hello: %w", cfg.Topic, err)
	}
	return c, nil
}

// createClaims creates the claims topic if it is missing: its records are
// stamped by the broker (LogAppendTime), not by their writers.
func createClaims(ctx context.Context, cfg ClaimsConfig) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID("kcr-standby-claims")}, cfg.Opts...)...)
	if err != nil {
		return fmt.Errorf("%w: --brokers %v: %v", ErrConfig, cfg.Brokers, err)
	}
	defer cl.Close()
	day, seg, stamp := "86400000", "3600000", "LogAppendTime"
	_, err = kadm.NewClient(cl).CreateTopic(ctx, 1, -1, map[string]*string{"retention.ms": &day, "segment.ms": &seg, "message.timestamp.type": &stamp}, cfg.Topic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create the replicas' claims topic %q: %w (create it with one partition, or give --replicas-topic)", cfg.Topic, err)
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
	rec := &kgo.Record{Topic: c.topic, Partition: 0, Key: []byte(c.group), Value: b}
	if c.key != nil {
		rec.Headers = []kgo.RecordHeader{{Key: macHeader, Value: c.mac(b)}}
	}
	res := c.cl.ProduceSync(ctx, rec)
	out, err := res.First()
	if err != nil {
		return 0, fmt.Errorf("write to the claims topic %q: %w", c.topic, err)
	}
	return out.Offset, nil
}

// mac is the HMAC of a record's value, bound to the topic and group.
func (c *Claims) mac(value []byte) []byte {
	h := hmac.New(sha256.New, c.key)
	h.Write([]byte(c.topic))
	h.Write([]byte{0})
	h.Write([]byte(c.group))
	h.Write([]byte{0})
	h.Write(value)
	return h.Sum(nil)
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

// parse returns the record of the group r is, or why it does not count:
// another group's, unsigned, malformed or out of bounds.
func (c *Claims) parse(r *kgo.Record) (claimRecord, string) {
	var cr claimRecord
	switch {
	case string(r.Key) != c.group:
		return cr, "other group"
	case len(r.Value) > claimsMaxRecord:
		return cr, "too long"
	case c.key != nil && !c.signed(r):
		return cr, "not signed with --replicas-key-file"
	}
	if err := json.Unmarshal(r.Value, &cr); err != nil {
		return cr, "not a claim: " + err.Error()
	}
	switch {
	case cr.Kind != "hello" && cr.Kind != "claim" && cr.Kind != "asleep":
		return cr, "unknown kind"
	case cr.Replica == "" || len(cr.Replica) > claimsMaxName || !printable(cr.Replica):
		return cr, "bad replica name"
	case len(cr.Reason) > claimsMaxText || len(cr.Version) > claimsMaxText || !printable(cr.Reason) || !printable(cr.Version):
		return cr, "bad text"
	case cr.Kind == "claim" && (cr.Live < 0 || cr.Want <= cr.Live || cr.Want > cr.Live+claimsMaxStep):
		return cr, "wanted members out of bounds"
	}
	return cr, ""
}

func (c *Claims) signed(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == macHeader {
			return hmac.Equal(h.Value, c.mac(r.Value))
		}
	}
	return false
}

// printable: valid UTF-8 without control or invisible characters, so that
// a name is shown as it is.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// apply applies one record of the log: the compare-and-swap.
func (c *Claims) apply(r *kgo.Record) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next = r.Offset + 1
	cr, bad := c.parse(r)
	switch {
	case bad != "":
	case cr.Kind == "hello" && c.hellos[cr.Replica]:
		bad = "a hello replayed"
	case cr.Kind == "hello" && (r.Timestamp.Sub(time.UnixMilli(cr.At)).Abs() > claimsHelloSkew):
		bad = fmt.Sprintf("a hello written %v from its broker timestamp (replayed, or its host's clock is off)", r.Timestamp.Sub(time.UnixMilli(cr.At)).Round(time.Second))
	case cr.Kind != "hello" && cr.Prev != c.last:
		// A claim that lost, an asleep its writer writes again, or a
		// replay: nothing changes.
		c.progressed()
		return
	}
	if bad != "" {
		if string(r.Key) == c.group {
			c.junk++
			if now.Sub(c.junkLog) >= time.Minute {
				c.junkLog = now
				c.log.Warn("standby: replicas: records of the group in the claims topic that do not count (junk, forged or of another kcr); they change nothing", "topic", c.topic, "offset", r.Offset, "why", bad, "so_far", c.junk)
			}
		}
		c.progressed() // nothing changed: only ReadTo is woken
		return
	}
	defer c.notify()
	if cr.V > claimsFormat {
		c.log.Warn("standby: replicas: a claim of a newer format (another kcr version); the compare-and-swap still holds", "replica", cr.Replica, "format", cr.V)
	}
	c.last = r.Offset
	switch cr.Kind {
	case "hello":
		c.sawHello(cr.Replica)
		if cr.Replica != c.self && cr.Version != c.ver {
			c.log.Info("standby: replicas: a replica of another kcr version; they still coordinate", "replica", cr.Replica, "kcr_version", cr.Version)
		}
		return
	case "asleep":
		// Its claims are spent, however briefly it was a member.
		for i := range c.valid {
			if c.valid[i].Replica == cr.Replica {
				c.valid[i].Spent = true
			}
		}
		if cr.Replica == c.self {
			c.asleep = r.Offset
		}
		return
	}
	c.valid = append(c.valid, Claim{Offset: r.Offset, At: c.readAt(r, now), Replica: cr.Replica, Live: cr.Live, Want: cr.Want, Reason: cr.Reason})
	c.prune(now)
}

// sawHello records that name's hello counted; c.mu is held.
func (c *Claims) sawHello(name string) {
	c.hellos[name] = true
	c.helloQ = append(c.helloQ, name)
	if n := len(c.helloQ) - claimsMaxHellos; n > 0 {
		for _, old := range c.helloQ[:n] {
			delete(c.hellos, old)
		}
		c.helloQ = append(c.helloQ[:0], c.helloQ[n:]...)
	}
}

// readAt is a claim's time: now, or, read when the log opens (before this
// replica's hello), its broker timestamp if that is earlier.
func (c *Claims) readAt(r *kgo.Record, now time.Time) time.Time {
	if (c.hello < 0 || r.Offset < c.hello) && r.Timestamp.Before(now) {
		return r.Timestamp
	}
	return now
}

// prune drops the claims older than claimsKeep, and the oldest past
// claimsMax; c.mu is held.
func (c *Claims) prune(now time.Time) {
	keep := c.valid[:0]
	for _, v := range c.valid {
		if now.Sub(v.At) <= claimsKeep {
			keep = append(keep, v)
		}
	}
	clear(c.valid[len(keep):])
	c.valid = keep
	if n := len(c.valid) - claimsMax; n > 0 {
		c.valid = append(c.valid[:0], c.valid[n:]...)
	}
}

// notify wakes those waiting for a change, and ReadTo; c.mu is held.
func (c *Claims) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
	c.progressed()
}

// progressed wakes ReadTo; c.mu is held.
func (c *Claims) progressed() {
	close(c.read)
	c.read = make(chan struct{})
}

// Changed is closed at the next record of the group that counts.
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
		done, ch := c.next > off, c.read
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
	want = min(max(want, live+1), live+claimsMaxStep) // what readers count
	if len(reason) > claimsMaxText {
		reason = reason[:claimsMaxText]
	}
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
// returns once the record counted: written on the last reading, as a
// claim is (written after another record of the group, it is written
// again).
func (c *Claims) Asleep(ctx context.Context) error {
	for range claimsAsleepTries {
		c.mu.Lock()
		prev := c.last
		c.mu.Unlock()
		off, err := c.write(ctx, claimRecord{Kind: "asleep", Prev: prev})
		if err != nil {
			return err
		}
		if err := c.ReadTo(ctx, off); err != nil {
			return err
		}
		c.mu.Lock()
		ok := c.asleep == off
		c.mu.Unlock()
		if ok {
			return nil
		}
	}
	return fmt.Errorf("the claims topic %q: %d asleep records in a row came after another record of the group", c.topic, claimsAsleepTries)
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
