// Command kgoapp is the franz-go twin of kafkaapp, the target program of
// kcr's Kafka end-to-end tests: it produces numbered records at a steady
// rate through a kgohooks.Client (an idempotent kgo producer) and serves
// kcr's control socket. Its events (JSON lines on stdout, see kafkaapp and
// package appkit) have the same shape as kafkaapp's:
//
//	ready        the state listener's address and the control socket
//	acked        {"from":N,"to":N,"inst":I,"rhpid":H}: record N was
//	             acknowledged; I and H are its "inst" and "hpid" headers
//	write-error  a produce failed (the record is produced again)
//	pending      from the last before-checkpoint hook: the records produced
//	             and not acknowledged yet, the client's report, and the
//	             process's TCP sockets to the brokers (from the kernel)
//	after        from the last after-restore hook: kind, generation,
//	             instance id and the client id
//	producer     the producer id of the current kgo client (after start and
//	             after every restore or resume)
//	txn          (-transform-from) a transaction ended: committed, records
//	held         (-hold-txn) the transaction held open across the checkpoint,
//	             with the "partition/offset" of its inputs
//	fenced       (-transform-from) kgo's fencing error, from End or from Begin
//	             (op "begin"): the loop stops
//	proc         (-consume, -share) records processed: {"p":P,"from":O,"to":O},
//	             with -share one record and its delivery count "dc"
//	exit         after SIGTERM, once everything was flushed and closed
package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/test/apps/appkit"
)

var emit = appkit.Emit

// readCommitted (-read-committed): the consumers fetch read_committed.
var readCommitted bool

// isolation is the consumers' kgo.FetchIsolationLevel option.
func isolation() kgo.Opt {
	if readCommitted {
		return kgo.FetchIsolationLevel(kgo.ReadCommitted())
	}
	return kgo.FetchIsolationLevel(kgo.ReadUncommitted())
}

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	topic := flag.String("topic", "", "topic to produce to")
	clientID := flag.String("client-id", "kgoapp", "base client id")
	rate := flag.Int("produce-rate", 200, "records per second to produce")
	listen := flag.String("listen", "127.0.0.1:0", `address of the state listener ("": none)`)
	logLevel := flag.String("log-level", "info", "level of the slog records logged as ev=log (debug, info, warn)")
	from := flag.String("transform-from", "", "copy this topic to -topic in transactions (consume-transform-produce) instead of producing")
	group := flag.String("group", "", "consumer group (with -transform-from)")
	txnID := flag.String("txn-id", "", "base transactional id (with -transform-from)")
	holdTxn := flag.Bool("hold-txn", false, "with -transform-from: leave a transaction with records open across the first checkpoint")
	keepTxnID := flag.Bool("keep-txn-id", false, "with -transform-from: kgohooks.KeepTxnID (a restored copy keeps the transactional id)")
	consume := flag.Bool("consume", false, "consume -topic as a member of -group, committing after processing, instead of producing")
	balancer := flag.String("balancer", "", `with -consume: "server" for a KIP-848 group (kgo.ServerSideBalancer), "" for classic, "custom" for classic with a custom assignor`)
	instanceID := flag.String("instance-id", "", "with -consume: the static member's kgo.InstanceID")
	flag.BoolVar(&readCommitted, "read-committed", false, "with -consume or -transform-from: fetch read_committed (kgo.FetchIsolationLevel)")
	flag.DurationVar(&procDelay, "proc-delay", 0, "with -consume: time spent on each record (a service of known capacity: 1/proc-delay records per second)")
	kgoLog := flag.Bool("kgo-log", false, `log kgo's warnings and errors as events "kgo-log"`)
	shareMode := flag.Bool("share", false, "consume -topic as a member of the share group -group (kgohooks.ShareConsumer), instead of producing")
	shareMax := flag.Int("share-max", 10, "with -share: records per poll (kgo.ShareMaxRecords, strict)")
	heldWait := flag.Duration("held-wait", 0, "with -share: kgohooks.WithHeldWait (0: its default)")
	shareEarliest := flag.Bool("share-earliest", false, "set the share group -group's share.auto.offset.reset to earliest (first, with -share; else then exit)")
	burst := flag.Int("burst", 0, "produce this many records to -topic at once, then exit")
	listenFDs := flag.Bool("listen-fds", false, "with -consume: serve the state on the socket of LISTEN_FDS (kcr standby --listen); every connection counts as activity (notify.Touch)")
	var sec appkit.Security
	sec.Flags(flag.CommandLine)
	ballastMB := flag.Int("ballast-mb", 0, "hold this many MiB of touched memory (a large service: a longer dump)")
	flag.Parse()
	fillBallast(*ballastMB)
	if *topic == "" || *rate < 1 || (*from != "" && (*group == "" || *txnID == "")) || (*consume && *group == "") {
		appkit.Fatal(2, "need -topic, a positive -produce-rate, -group and -txn-id with -transform-from, -group with -consume")
	}
	if err := appkit.SetLogger(*logLevel); err != nil {
		appkit.Fatal(2, err.Error())
	}
	var err error
	if secOpts, err = securityOpts(&sec, *kgoLog); err != nil {
		appkit.Fatal(2, err.Error())
	}
	if *burst > 0 {
		if err := produceBurst(strings.Split(*brokers, ","), *topic, *clientID, *burst); err != nil {
			appkit.Fatal(1, err.Error())
		}
		return
	}
	if *shareEarliest {
		if err := setShareEarliest(strings.Split(*brokers, ","), *group); err != nil {
			appkit.Fatal(1, err.Error())
		}
		if !*shareMode {
			return
		}
	}
	if *shareMode {
		if *group == "" || *shareMax < 1 {
			appkit.Fatal(2, "need -group and a positive -share-max with -share")
		}
		if err := runShare(strings.Split(*brokers, ","), *topic, *group, *clientID, *shareMax, *heldWait); err != nil {
			appkit.Fatal(1, err.Error())
		}
		return
	}
	if *consume {
		if err := runConsume(strings.Split(*brokers, ","), *topic, *group, *clientID, *balancer, *instanceID, *listenFDs); err != nil {
			appkit.Fatal(1, err.Error())
		}
		return
	}
	if *from != "" {
		if err := runTransform(strings.Split(*brokers, ","), *from, *topic, *group, *txnID, *clientID, *holdTxn, *keepTxnID); err != nil {
			appkit.Fatal(1, err.Error())
		}
		return
	}
	if err := run(strings.Split(*brokers, ","), *topic, *clientID, *rate, *listen); err != nil {
		appkit.Fatal(1, err.Error())
	}
}

type app struct {
	cl      *kgohooks.Client
	ports   []int // the brokers' ports
	retry   chan int
	acked   atomic.Int64
	failed  atomic.Int64
	pending appkit.Pending
}

func run(brokers []string, topic, clientID string, rate int, listen string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a := &app{retry: make(chan int, 1<<16), ports: appkit.Ports(brokers)}

	// Registered first: its before-checkpoint hook runs last, once the
	// client has quiesced.
	notify.Register("kgoapp-probe", notify.Func(a.beforeLast, nil))
	cl, err := kgohooks.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.ProducerLinger(5 * time.Millisecond),
		kgo.RecordDeliveryTimeout(30 * time.Second)}, secOpts...)...)
	if err != nil {
		return err
	}
	a.cl = cl
	// Registered last: its after-restore hook runs once the client is new.
	notify.Register("kgoapp", notify.Func(nil, a.afterLast))

	// -listen "": no state listener, so that a copy restored beside an
	// original that went on (--leave-running) need not bind its port.
	addr := ""
	if listen != "" {
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
		if err != nil {
			return err
		}
		defer ln.Close()
		addr = ln.Addr().String()
		go appkit.ServeState(ln, a.state)
	}
	srv, err := notify.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	go a.reportProducer()
	emit("ready", "listen", addr, "socket", srv.Path())

	a.produceLoop(ctx, rate)
	fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ferr := cl.Flush(fctx)
	cancel()
	cl.Close()
	emit("exit", "acked", a.acked.Load(), "pending", a.pending.Runs(), "writer_close", appkit.ErrString(ferr))
	return nil
}

func runTransform(brokers []string, in, out, group, txnID, clientID string, holdTxn, keepTxnID bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	x, err := newTransformer(brokers, in, out, group, txnID, clientID, holdTxn, keepTxnID)
	if err != nil {
		return err
	}
	notify.Register("kgoapp", notify.Func(x.before, func(_ context.Context, ev notify.Event) error { x.after(ev); return nil }))
	// No state listener: a copy restored next to an original that went on
	// (--leave-running) could not bind its port again.
	srv, err := notify.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	emit("ready", "listen", "", "socket", srv.Path(), "txn_id", x.s.TransactionalID())
	x.loop(ctx)
	x.s.Close()
	emit("exit", "committed", x.committed.Load(), "aborted", x.aborted.Load())
	return nil
}

// produceLoop produces records 1, 2, … at rate per second, and again the
// ones that failed. Ticks missed while the process was stopped are not made
// up for.
func (a *app) produceLoop(ctx context.Context, rate int) {
	n := 0
	appkit.Pace(ctx, rate, func() bool {
		select {
		case r := <-a.retry:
			a.produce(ctx, r)
		default:
			n++
			a.produce(ctx, n)
		}
		return true
	})
}

func (a *app) produce(ctx context.Context, n int) {
	// The record says who built it: the instance id (changed by the
	// after-restore hooks) and the host PID (changed by the restore).
	inst, hpid := a.pending.Start(n)
	v := []byte(strconv.Itoa(n))
	rec := &kgo.Record{Key: v, Value: v, Headers: []kgo.RecordHeader{
		{Key: "inst", Value: []byte(inst)}, {Key: "hpid", Value: []byte(strconv.Itoa(hpid))}}}
	// Not ctx: records handed to the client are never abandoned by the app;
	// a Produce waiting at the checkpoint gate waits for the restore.
	a.cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
		a.pending.Done(n)
		if err != nil {
			a.failed.Add(1)
			emit("write-error", "err", err.Error(), "records", [][2]int{{n, n}})
			if !errors.Is(err, kgo.ErrClientClosed) {
				a.retry <- n
			}
			return
		}
		a.acked.Add(1)
		emit("acked", "from", n, "to", n, "inst", inst, "rhpid", hpid)
	})
}

func (a *app) beforeLast(ctx context.Context) error {
	// Last before the dump: the kernel's count of sockets to the brokers.
	emit("pending", "records", a.pending.Hold(), "writer", a.cl.CheckpointReport(), "broker_sockets", appkit.SocketsTo(a.ports), "leave_running", notify.LeaveRunning(ctx))
	return nil
}

func (a *app) afterLast(ctx context.Context, ev notify.Event) error {
	a.pending.Release()
	appkit.EmitAfter(ev, "writer_client", a.cl.ClientID())
	go a.reportProducer()
	return nil
}

// reportProducer logs the current client's producer id (for the log; the
// tests ask the broker).
func (a *app) reportProducer() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, epoch, err := a.cl.ProducerID(ctx)
	emit("producer", "id", id, "epoch", epoch, "err", appkit.ErrString(err))
}

// state is the app's part of the state listener's line.
func (a *app) state() map[string]any {
	return map[string]any{
		"writer_client": a.cl.ClientID(), "acked": a.acked.Load(), "failed": a.failed.Load(), "pending": a.pending.Len(),
	}
}

// ballast is memory the service holds, every page touched (fillBallast).
var ballast []byte

// fillBallast allocates mb MiB and writes every page, so that each is
// resident and dumped.
func fillBallast(mb int) {
	ballast = make([]byte, mb<<20)
	for i := 0; i < len(ballast); i += 4096 {
		ballast[i] = byte(i>>12) | 1
	}
}
