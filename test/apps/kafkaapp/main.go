// Command kafkaapp is the target program of kcr's Kafka end-to-end tests. It
// produces numbered records at a steady rate and/or consumes a topic as a
// member of a consumer group, through kafkahooks' Writer and Reader, and
// serves kcr's control socket (notify.Start).
//
// It writes one JSON line per event to stdout, which the tests read. Every
// event has "pid" (getpid(), 1 in a PID namespace of kcr run) and "hpid", the
// host PID (/proc/self of the host's procfs), which tells the clones of one
// image apart from their first event on, before kcr told them who they are.
//
//	ready        the state listener's address and the control socket
//	acked        {"from":N,"to":M,"inst":I,"rhpid":H}: records N..M (values)
//	             were acknowledged; I and H are their "inst" and "hpid"
//	             headers (the writer's identity when it built them)
//	write-error  a WriteMessages call failed for these records (the others of
//	             the call, per kafka.WriteErrors, are acked; they are written
//	             again, unless -no-retry)
//	reproduce-error  a -reproduce write from a Completion failed
//	proc         {"p":P,"from":A,"to":B}: offsets A..B of partition P were
//	             processed; the commit follows (at-least-once), so an
//	             offset a killed process committed was always logged
//	commit-error a commit failed (the records will be processed again)
//	pending      from the last before-checkpoint hook: the records handed to
//	             the Writer and not acknowledged yet, and the Writer's report
//	after        from the last after-restore hook: kind, generation,
//	             instance id and the client ids of the Writer and the Reader
//	log          kafkahooks' and notify's slog records
//	exit         after SIGTERM, once everything was flushed and closed
//
// Its state listener answers every connection with one JSON line: goroutine
// and open fd counts, identity, client ids and counters.
package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/kcr-dev/kcr/kafkahooks"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/test/apps/appkit"
)

type config struct {
	brokers        []string
	topic, group   string
	clientID       string
	rate           int
	async          bool
	writers        int
	batch          int
	consume        bool
	sessionTimeout time.Duration
	handover       bool
	heartbeat      time.Duration
	slowHook       time.Duration
	slowHookFile   string
	reproduce      int
	startLast      bool
	partition      int
	noCommit       bool
	commitInterval time.Duration
	maxAttempts    int
	noRetry        bool
	offsetsCheck   time.Duration
	sec            *appkit.Security
}

func main() {
	var c config
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	flag.StringVar(&c.topic, "topic", "", "topic to produce to and consume from")
	flag.StringVar(&c.group, "group", "", "consumer group (with -consume)")
	flag.StringVar(&c.clientID, "client-id", "kafkaapp", "base client id of the Writer and the Reader")
	flag.IntVar(&c.rate, "produce-rate", 0, "records per second to produce (0: no producer)")
	flag.BoolVar(&c.async, "async", false, "use an Async writer")
	flag.IntVar(&c.writers, "writers", 4, "goroutines calling WriteMessages (sync writer)")
	flag.IntVar(&c.batch, "batch", 10, "most records per WriteMessages call")
	flag.BoolVar(&c.consume, "consume", false, "consume -topic as a member of -group, committing after processing")
	flag.IntVar(&c.partition, "partition", -1, "with -consume and no -group: read this partition with a partition Reader (no commits)")
	flag.DurationVar(&c.commitInterval, "commit-interval", 0, "with -consume: the Reader's CommitInterval (0: synchronous commits)")
	flag.IntVar(&c.maxAttempts, "max-attempts", 0, "the Writer's MaxAttempts (0: kafka-go's default)")
	flag.DurationVar(&c.offsetsCheck, "offsets-check-after", time.Minute, "with -group: the Reader's WithOffsetsCheckAfter (0: check the committed offsets on every restore)")
	flag.BoolVar(&c.noRetry, "no-retry", false, "records whose write failed are not written again (write-error tells which)")
	flag.BoolVar(&c.noCommit, "no-commit", false, "with -consume: never commit (only the Reader's own checkpoint commits)")
	flag.BoolVar(&c.startLast, "start-last", false, "with -consume: start at the end (group: StartOffset LastOffset; partition Reader: SetOffset(LastOffset))")
	flag.IntVar(&c.reproduce, "reproduce", 0, "with -async: the Completion of every acknowledged record N with N%K==0 writes record N+1000000 to the same Writer (retry/dead-letter pattern)")
	flag.DurationVar(&c.sessionTimeout, "session-timeout", 6*time.Second, "consumer group session timeout")
	flag.DurationVar(&c.heartbeat, "heartbeat", time.Second, "consumer group heartbeat interval")
	flag.BoolVar(&c.handover, "group-handover", false, "with -consume and -group: keep the membership across a checkpoint (kafkahooks.WithGroupHandover)")
	listen := flag.String("listen", "127.0.0.1:0", "address of the state listener")
	listenFDs := flag.Bool("listen-fds", false, "serve the state on the socket of LISTEN_FDS (kcr standby --listen) instead of -listen; every connection counts as activity (notify.Touch)")
	flag.StringVar(&c.slowHookFile, "slow-hook-file", "", "while this file exists, the slow before-checkpoint hook takes the duration it holds (a fault to inject)")
	flag.DurationVar(&c.slowHook, "slow-hook", 0, "a before-checkpoint hook that runs last and takes this long (or until its deadline)")
	failCheckpoint := flag.Bool("fail-checkpoint", false, "register a resource whose before-checkpoint hook fails")
	logLevel := flag.String("log-level", "info", "level of the slog records logged as ev=log (debug, info, warn)")
	heapMB := flag.Int("heap-mb", 0, "keep this many MiB of filled memory (an image that takes a while to restore)")
	c.sec = new(appkit.Security)
	c.sec.Flags(flag.CommandLine)
	flag.Parse()
	heap := make([]byte, *heapMB<<20)
	for i := range heap {
		heap[i] = byte(i * 7)
	}
	defer runtime.KeepAlive(heap)
	c.brokers = strings.Split(*brokers, ",")
	if c.topic == "" || (c.consume && c.group == "" && c.partition < 0) || c.writers < 1 || c.batch < 1 {
		appkit.Fatal(2, "need -topic, -group with -consume, positive -writers and -batch")
	}
	if err := appkit.SetLogger(*logLevel); err != nil {
		appkit.Fatal(2, err.Error())
	}
	if err := c.sec.Check(); err != nil {
		appkit.Fatal(2, err.Error())
	}
	if c.sec.SASL == "oauthbearer" {
		appkit.Fatal(2, "-sasl oauthbearer: kafka-go has no OAUTHBEARER mechanism (use scram-sha-512)")
	}
	if *failCheckpoint {
		notify.Register("failing", notify.Func(func(context.Context) error { return errors.New("refusing the checkpoint (-fail-checkpoint)") }, nil))
	}
	if *listenFDs {
		*listen = ""
	}
	if err := run(c, *listen); err != nil {
		appkit.Fatal(1, err.Error())
	}
}

type app struct {
	cfg config
	w   *kafkahooks.Writer
	r   *kafkahooks.Reader

	next    chan int // record numbers to write, in order
	retry   chan []int
	acked   atomic.Int64
	failed  atomic.Int64
	procd   atomic.Int64
	pending appkit.Pending
	takeMu  sync.Mutex // one writer takes numbers at a time: batches are runs
}

func run(c config, listen string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	a := &app{cfg: c, next: make(chan int, 4096), retry: make(chan []int, 1024)}

	if c.slowHook > 0 || c.slowHookFile != "" {
		notify.Register("kafkaapp-slow", notify.Func(func(ctx context.Context) error {
			d := c.slowHook
			if b, err := os.ReadFile(c.slowHookFile); c.slowHookFile != "" && err == nil {
				d, _ = time.ParseDuration(strings.TrimSpace(string(b)))
			}
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}, nil))
	}
	// Registered first: its before-checkpoint hook runs last, once the
	// Writer and the Reader have quiesced (only -slow-hook runs after it).
	notify.Register("kafkaapp-probe", notify.Func(a.beforeLast, nil))
	tlsCfg, err := c.sec.TLS()
	if err != nil {
		return err
	}
	var mech sasl.Mechanism
	if c.sec.SASL == "scram-sha-512" {
		if mech, err = scram.Mechanism(scram.SHA512, c.sec.User, c.sec.Password); err != nil {
			return err
		}
	}
	var transport *kafka.Transport
	dialer := kafka.DefaultDialer
	if tlsCfg != nil || mech != nil {
		transport = &kafka.Transport{TLS: tlsCfg, SASL: mech}
		dialer = &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: tlsCfg, SASLMechanism: mech}
	}
	if c.rate > 0 {
		tmpl := &kafka.Writer{
			Addr:         kafka.TCP(c.brokers...),
			Topic:        c.topic,
			BatchTimeout: 5 * time.Millisecond,
			BatchSize:    100,
			RequiredAcks: kafka.RequireAll,
			Async:        c.async,
			WriteTimeout: 5 * time.Second,
			MaxAttempts:  c.maxAttempts,
			Transport:    transport,
		}
		if c.async {
			tmpl.Completion = a.completion
		}
		a.w = kafkahooks.NewWriter(tmpl, kafkahooks.WithClientID(c.clientID), kafkahooks.WithRetryBackoff(100*time.Millisecond, 2*time.Second))
	}
	if c.consume {
		start := kafka.FirstOffset
		if c.startLast {
			start = kafka.LastOffset
		}
		partition := 0
		if c.group == "" {
			partition = c.partition
		}
		readerOpts := []kafkahooks.ReaderOpt{kafkahooks.WithClientID(c.clientID), kafkahooks.WithOffsetsCheckAfter(c.offsetsCheck)}
		if c.handover {
			readerOpts = append(readerOpts, kafkahooks.WithGroupHandover())
		}
		a.r = kafkahooks.NewReader(kafka.ReaderConfig{
			Brokers:           c.brokers,
			GroupID:           c.group,
			Topic:             c.topic,
			Partition:         partition,
			MaxWait:           500 * time.Millisecond,
			SessionTimeout:    c.sessionTimeout,
			HeartbeatInterval: c.heartbeat,
			RebalanceTimeout:  c.sessionTimeout,
			JoinGroupBackoff:  500 * time.Millisecond,
			ReadBackoffMin:    50 * time.Millisecond,
			ReadBackoffMax:    500 * time.Millisecond,
			StartOffset:       start,
			CommitInterval:    c.commitInterval,
			Dialer:            dialer,
		}, readerOpts...)
		if c.group == "" && c.startLast {
			if err := a.r.SetOffset(kafka.LastOffset); err != nil {
				return err
			}
		}
	}
	// Registered last: its after-restore hook runs last, once the Writer and
	// the Reader have their new client ids.
	notify.Register("kafkaapp", notify.Func(nil, a.afterLast))

	var ln net.Listener
	if listen == "" {
		// kcr standby --listen: its socket, and every connection is work.
		ln, err = appkit.HandedListener()
	} else {
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
	}
	if err != nil {
		return err
	}
	srv, err := notify.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	go appkit.ServeState(ln, a.state)

	var wg sync.WaitGroup
	wctx, wstop := context.WithCancel(context.Background())
	if a.w != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.generate(ctx) }()
		n := c.writers
		if c.async {
			n = 1
		}
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); a.writeLoop(ctx, wctx) }()
		}
	}
	var cwg sync.WaitGroup
	if a.r != nil {
		cwg.Add(1)
		go func() { defer cwg.Done(); a.consumeLoop(ctx) }()
	}
	emit("ready", "listen", ln.Addr().String(), "socket", srv.Path())

	<-ctx.Done()
	wg.Wait()
	wstop()
	var werr, rerr error
	if a.w != nil {
		werr = a.w.Close() // flushes an Async writer's records
	}
	cwg.Wait()
	if a.r != nil {
		rerr = a.r.Close()
	}
	emit("exit", "acked", a.acked.Load(), "processed", a.procd.Load(), "pending", a.pending.Runs(),
		"writer_close", errString(werr), "reader_close", errString(rerr))
	ln.Close()
	return nil
}

// generate hands out record numbers 1, 2, … at the configured rate. Ticks
// missed while the process was stopped or checkpointed are not made up for.
func (a *app) generate(ctx context.Context) {
	n := 0
	appkit.Pace(ctx, a.cfg.rate, func() bool {
		n++
		select {
		case a.next <- n:
			return true
		case <-ctx.Done():
			return false
		}
	})
}

// take returns the next batch of numbers to write: records to retry first,
// else a run of new ones.
func (a *app) take(ctx context.Context) []int {
	select {
	case b := <-a.retry:
		return b
	default:
	}
	a.takeMu.Lock()
	defer a.takeMu.Unlock()
	var b []int
	select {
	case b = <-a.retry:
		return b
	case n := <-a.next:
		b = append(b, n)
	case <-ctx.Done():
		return nil
	}
	for len(b) < a.cfg.batch {
		select {
		case n := <-a.next:
			b = append(b, n)
		default:
			return b
		}
	}
	return b
}

func (a *app) writeLoop(ctx, wctx context.Context) {
	for {
		b := a.take(ctx)
		if b == nil {
			return
		}
		// The records say who built them: the instance id (changed by the
		// after-restore hooks) and the host PID (changed by the restore).
		inst, h := a.pending.Start(b...)
		hpid := strconv.Itoa(h)
		msgs := make([]kafka.Message, len(b))
		for i, n := range b {
			msgs[i] = kafka.Message{Key: []byte(strconv.Itoa(n)), Value: []byte(strconv.Itoa(n)),
				Headers: []kafka.Header{{Key: "inst", Value: []byte(inst)}, {Key: "hpid", Value: []byte(hpid)}}}
		}
		// wctx ends only after every writer returned: records handed to
		// the Writer are never abandoned by the app.
		err := a.w.WriteMessages(wctx, msgs...)
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == len(b) {
			// kafka.WriteErrors says which records failed: the others
			// were acknowledged.
			var ok, bad []int
			err = nil
			for i, n := range b {
				if werrs[i] == nil {
					ok = append(ok, n)
					continue
				}
				bad = append(bad, n)
				if err == nil {
					err = werrs[i] // the first failure, for the event
				}
			}
			if len(ok) > 0 {
				a.pending.Done(ok...)
				a.ackRuns(ok, inst, hpid)
			}
			b = bad
		}
		switch {
		case err != nil:
			a.pending.Done(b...)
			a.failed.Add(int64(len(b)))
			emit("write-error", "err", err.Error(), "records", runs(b))
			if wctx.Err() != nil {
				return
			}
			if a.cfg.noRetry {
				continue
			}
			time.Sleep(200 * time.Millisecond)
			a.retry <- b
		case !a.cfg.async:
			a.pending.Done(b...)
			a.ackRuns(b, inst, hpid)
		}
	}
}

// completion is the Async writer's Completion callback.
func (a *app) completion(msgs []kafka.Message, err error) {
	b := make([]int, 0, len(msgs))
	// An Async writer batches records of several WriteMessages calls:
	// group them by the identity they carry.
	type stamp struct{ inst, hpid string }
	by := map[stamp][]int{}
	for _, m := range msgs {
		n, _ := strconv.Atoi(string(m.Value))
		b = append(b, n)
		var s stamp
		for _, h := range m.Headers {
			switch h.Key {
			case "inst":
				s.inst = string(h.Value)
			case "hpid":
				s.hpid = string(h.Value)
			}
		}
		by[s] = append(by[s], n)
	}
	a.pending.Done(b...)
	if err != nil {
		a.failed.Add(int64(len(b)))
		emit("write-error", "err", err.Error(), "records", runs(b), "async", true)
		if a.cfg.noRetry {
			return
		}
		select {
		case a.retry <- b:
		default:
			emit("lost", "records", runs(b)) // never expected: the retry queue is large
		}
		return
	}
	for s, ns := range by {
		a.ackRuns(ns, s.inst, s.hpid)
	}
	if a.cfg.reproduce > 0 {
		a.reproduce(msgs)
	}
}

// reproduce writes, from inside the Completion, record N+1000000 for every
// acknowledged record N with N%K==0 to the same Writer: the retry or
// dead-letter pattern, which must not wedge a checkpoint.
func (a *app) reproduce(msgs []kafka.Message) {
	var b []int
	var out []kafka.Message
	for _, m := range msgs {
		n, _ := strconv.Atoi(string(m.Value))
		if n >= derivedBase || n%a.cfg.reproduce != 0 {
			continue
		}
		d := n + derivedBase
		b = append(b, d)
		out = append(out, kafka.Message{Key: []byte(strconv.Itoa(d)), Value: []byte(strconv.Itoa(d)), Headers: m.Headers})
	}
	if len(out) == 0 {
		return
	}
	a.pending.Add(b...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.w.WriteMessages(ctx, out...); err != nil {
		a.pending.Done(b...)
		emit("reproduce-error", "err", err.Error(), "records", runs(b))
	}
}

// derivedBase is added to a record's number by -reproduce.
const derivedBase = 1000000

// ackRuns logs records acknowledged, with the identity they carry (one
// WriteMessages call or Completion is records of one batch, built at once).
func (a *app) ackRuns(b []int, inst, hpid string) {
	a.acked.Add(int64(len(b)))
	rh, _ := strconv.Atoi(hpid)
	for _, r := range runs(b) {
		emit("acked", "from", r[0], "to", r[1], "inst", inst, "rhpid", rh)
	}
}

// consumeLoop fetches records, processes them and commits them in small
// batches (at-least-once).
func (a *app) consumeLoop(ctx context.Context) {
	var batch []kafka.Message
	errs := 0
	for {
		fctx, cancel := ctx, context.CancelFunc(func() {})
		if len(batch) > 0 {
			fctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
		}
		m, err := a.r.FetchMessage(fctx)
		cancel()
		switch {
		case err == nil:
			batch = append(batch, m)
			if len(batch) < 50 {
				continue
			}
		case ctx.Err() != nil:
			a.commit(batch)
			return
		case errors.Is(err, context.DeadlineExceeded):
		default:
			if errs++; errs <= 20 || errs%100 == 0 {
				emit("fetch-error", "err", err.Error(), "count", errs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		a.commit(batch)
		batch = batch[:0]
	}
}

func (a *app) commit(batch []kafka.Message) {
	if len(batch) == 0 {
		return
	}
	// Logged before the commit: whatever a killed process committed was
	// logged as processed.
	a.procd.Add(int64(len(batch)))
	byPart := map[int][]int{}
	for _, m := range batch {
		byPart[m.Partition] = append(byPart[m.Partition], int(m.Offset))
	}
	for p, offs := range byPart {
		for _, r := range runs(offs) {
			emit("proc", "p", p, "from", r[0], "to", r[1])
		}
	}
	if a.cfg.group == "" || a.cfg.noCommit {
		return // a partition Reader has nothing to commit
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t := time.Now()
	err := a.r.CommitMessages(cctx, batch...)
	cancel()
	if err != nil {
		emit("commit-error", "err", err.Error(), "records", len(batch))
	} else {
		// Every commit and how long it took (a slow one met a
		// checkpoint): the soak's duplicates are traced through these.
		upto := map[int]int64{}
		for _, m := range batch {
			upto[m.Partition] = max(upto[m.Partition], m.Offset)
		}
		emit("committed", "us", time.Since(t).Microseconds(), "upto", upto)
	}
}

func (a *app) beforeLast(ctx context.Context) error {
	var rep map[string]any
	if a.w != nil {
		rep = a.w.CheckpointReport()
	}
	var reader any
	if a.r != nil {
		if rr, ok := a.r.Report(); ok {
			reader = rr // ran before this hook: records in the app's hands, stale commits
		}
	}
	emit("pending", "records", a.pending.Hold(), "writer", rep, "reader", reader, "leave_running", notify.LeaveRunning(ctx))
	return nil
}

func (a *app) afterLast(ctx context.Context, ev notify.Event) error {
	a.pending.Release()
	appkit.EmitAfter(ev, "writer_client", a.writerClient(), "reader_client", a.readerClient())
	return nil
}

func (a *app) writerClient() string {
	if a.w == nil {
		return ""
	}
	return a.w.ClientID()
}

func (a *app) readerClient() string {
	if a.r == nil {
		return ""
	}
	return a.r.ClientID()
}

// state is the app's part of the state listener's line.
func (a *app) state() map[string]any {
	return map[string]any{
		"writer_client": a.writerClient(), "reader_client": a.readerClient(),
		"acked": a.acked.Load(), "failed": a.failed.Load(), "processed": a.procd.Load(), "pending": a.pending.Len(),
	}
}

var (
	emit      = appkit.Emit
	hostPID   = appkit.HostPID
	runs      = appkit.Runs
	errString = appkit.ErrString
)
