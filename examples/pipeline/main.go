// Command pipeline is the service of kcr's demo: a Kafka consumer-producer
// with a slow, warm start, made checkpointable by kafkahooks.
//
//	pipeline -brokers 127.0.0.1:19092 -group pipeline -in orders -out results \
//	    [-warmup 3s] [-cache-mb 64] [-client-id pipeline] [-drain=true] [-client kafka-go|franz]
//
// It builds a lookup cache of -cache-mb MiB over -warmup (what a real
// service spends loading models, caches or JIT state), then consumes -in as a
// member of -group and, for every order, produces one numbered result to
// -out and commits the order once the result is acknowledged
// (at-least-once). A result's key is the order's id; its value carries the
// result's sequence number, the restore generation and instance id, so that
// examples/verify can tell copies apart.
//
// With -drain (the default) a before-checkpoint hook stops taking orders and
// finishes the batch in hand before kafkahooks' Reader and Writer quiesce, so
// that no order gets a second result after a restore. With -drain=false only
// kafkahooks' guarantees hold: an order whose result was produced but not yet
// committed is processed again (at-least-once).
//
// -client franz uses franz-go clients (kafkahooks/kgohooks) instead of
// kafka-go's (kafkahooks): the same pipeline, through small adapters.
//
// It writes one JSON line per event to stdout:
//
//	start         the process started (pid)
//	warm          the cache is built (ms, bytes)
//	first-result  the first result acknowledged after start, restore or resume ("after")
//	stats         every -stats-every: orders processed, consumer lag
//	after-restore the after-restore hook ran (kind, generation, instance)
//	exit          after SIGTERM, once the clients are closed
//
// kafkahooks' and notify's logs go to stderr as JSON; with -kgo-debug, so
// does kgo's debug log (franz-go), one timestamped line per event.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/kafkahooks"
	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
)

var (
	out   = json.NewEncoder(os.Stdout)
	outMu sync.Mutex
)

func emit(ev string, kv ...any) {
	m := map[string]any{"ev": ev, "src": "pipeline", "t": time.Now().UnixNano()}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	outMu.Lock()
	out.Encode(m)
	outMu.Unlock()
}

type config struct {
	brokers    []string
	group      string
	in, out    string
	clientID   string
	warmup     time.Duration
	cacheMB    int
	drain      bool
	statsEvery time.Duration
	batch      int
	orderCost  time.Duration
	client     string
	balancer   string // franz-go: "client" or "server" (KIP-848)
	kgoDebug   bool   // franz-go: kgo's debug log to stderr
	handover   bool   // kafka-go: kafkahooks.WithGroupHandover
	sec        security
}

func main() {
	var c config
	brokers := flag.String("brokers", "127.0.0.1:19092", "comma-separated bootstrap brokers")
	flag.StringVar(&c.group, "group", "pipeline", "consumer group")
	flag.StringVar(&c.in, "in", "orders", "topic of the orders")
	flag.StringVar(&c.out, "out", "results", "topic of the results")
	flag.StringVar(&c.clientID, "client-id", "pipeline", "base Kafka client id; a restored copy appends its instance id")
	flag.DurationVar(&c.warmup, "warmup", 3*time.Second, "time the cache takes to build before the first order is taken")
	flag.IntVar(&c.cacheMB, "cache-mb", 64, "size of the warm cache in MiB")
	flag.BoolVar(&c.drain, "drain", true, "finish the orders in hand before a checkpoint (no second results)")
	flag.DurationVar(&c.statsEvery, "stats-every", time.Second, "how often to log a stats event (0: never)")
	flag.IntVar(&c.batch, "batch", 64, "most orders per produce and commit")
	flag.DurationVar(&c.orderCost, "order-cost", 0, "time spent on each order before its result (a pipeline of known capacity: 1/order-cost orders per second)")
	flag.StringVar(&c.client, "client", "kafka-go", "Kafka client library: kafka-go or franz (franz-go)")
	flag.StringVar(&c.balancer, "kgo-balancer", "client", "franz-go group protocol: client (classic, cooperative-sticky) or server (KIP-848, kgo.ServerSideBalancer; Kafka 4.0+)")
	flag.BoolVar(&c.kgoDebug, "kgo-debug", false, "franz-go: write kgo's debug log (every request) to stderr")
	flag.BoolVar(&c.handover, "group-handover", false, "kafka-go: keep the group membership across a checkpoint (kafkahooks.WithGroupHandover)")
	flag.StringVar(&c.sec.ca, "tls-ca", "", "PEM file of the CA to trust: connect with TLS")
	flag.StringVar(&c.sec.user, "scram-user", "", "SASL SCRAM-SHA-512 user (none: no SASL)")
	flag.StringVar(&c.sec.password, "scram-password", "", "SASL SCRAM-SHA-512 password")
	flag.Parse()
	c.brokers = strings.Split(*brokers, ",")
	if _, err := c.sec.tlsConfig(); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline: -tls-ca:", err)
		os.Exit(2)
	}
	if c.cacheMB < 0 || c.warmup < 0 || c.orderCost < 0 || c.batch < 1 || c.group == "" || c.in == "" || c.out == "" ||
		(c.client != "kafka-go" && c.client != "franz") || (c.balancer != "client" && c.balancer != "server") {
		fmt.Fprintln(os.Stderr, "pipeline: need -group, -in, -out, -batch ≥ 1, -client kafka-go or franz, -kgo-balancer client or server, and no negative -warmup, -cache-mb or -order-cost")
		os.Exit(2)
	}
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("src", "pipeline"))
	emit("start", "pid", os.Getpid())
	if err := run(c); err != nil {
		emit("fatal", "err", err.Error())
		os.Exit(1)
	}
}

func run(c config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	t0 := time.Now()
	cache, err := BuildCache(ctx, c.cacheMB, c.warmup)
	if err != nil {
		return nil // stopped during the warm-up
	}
	emit("warm", "ms", time.Since(t0).Milliseconds(), "bytes", cache.Bytes())

	// Created in this order, so that a checkpoint quiesces the pipeline
	// first, then the producer, then the consumer, and a restore brings
	// them back the other way round.
	e, err := openEnds(c)
	if err != nil {
		return err
	}
	p := &Pipeline{In: e.in, Out: e.out, Cache: cache, Emit: emit, Batch: c.batch, OrderCost: c.orderCost}
	p.init()
	var before func(context.Context) error
	if c.drain {
		before = p.Drain
	}
	notify.Register("pipeline", notify.Func(before, p.Continue))

	srv, err := notify.Start()
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	defer srv.Close()

	if c.statsEvery > 0 {
		go emitStats(ctx, c.statsEvery, p, e.lag)
	}

	err = p.Run(ctx)
	cerr := e.close()
	emit("exit", "processed", p.Processed())
	if err != nil {
		return err
	}
	return cerr
}

// ends are the pipeline's Kafka clients: in reads orders, out writes
// results.
type ends struct {
	in    Fetcher
	out   Producer
	lag   func() int64 // the consumer's lag, -1 when the client does not tell
	close func() error
}

// openEnds opens the hooked clients of c.client: franz-go's or kafka-go's.
func openEnds(c config) (ends, error) {
	if c.client != "franz" {
		r, w := kafkaGoClients(c)
		return ends{in: r, out: w, lag: func() int64 { return r.Stats().Lag }, close: func() error {
			if err := w.Close(); err != nil {
				r.Close()
				return fmt.Errorf("closing the writer: %w", err)
			}
			if err := r.Close(); err != nil {
				return fmt.Errorf("closing the reader: %w", err)
			}
			return nil
		}}, nil
	}
	inOpts, outOpts := kgoOpts(c)
	icl, err := kgohooks.New(inOpts, kgohooks.WithName("kgo-in/"+c.clientID))
	if err != nil {
		return ends{}, err
	}
	ocl, err := kgohooks.New(outOpts, kgohooks.WithName("kgo-out/"+c.clientID))
	if err != nil {
		icl.Close()
		return ends{}, err
	}
	return ends{in: newKgoFetcher(icl), out: kgoProducer{ocl}, lag: func() int64 { return -1 }, close: func() error {
		fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := ocl.Flush(fctx)
		ocl.Close()
		icl.Close()
		return err
	}}, nil
}

// emitStats emits the processed count and the lag every interval until
// ctx ends.
func emitStats(ctx context.Context, every time.Duration, p *Pipeline, lag func() int64) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			emit("stats", "processed", p.Processed(), "lag", lag())
		}
	}
}

func readerOpts(c config) []kafkahooks.ReaderOpt {
	opts := []kafkahooks.ReaderOpt{kafkahooks.WithClientID(c.clientID)}
	if c.handover {
		opts = append(opts, kafkahooks.WithGroupHandover())
	}
	return opts
}

// kafkaGoClients are the pipeline's kafka-go consumer and producer.
func kafkaGoClients(c config) (*kafkahooks.Reader, *kafkahooks.Writer) {
	rc := kafka.ReaderConfig{
		Brokers:           c.brokers,
		GroupID:           c.group,
		Topic:             c.in,
		StartOffset:       kafka.FirstOffset,
		MaxWait:           250 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: time.Second,
		RebalanceTimeout:  6 * time.Second,
		JoinGroupBackoff:  250 * time.Millisecond,
		ReadBackoffMin:    20 * time.Millisecond,
		ReadBackoffMax:    250 * time.Millisecond,
	}
	wt := &kafka.Writer{
		Addr:         kafka.TCP(c.brokers...),
		Topic:        c.out,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, // acknowledged means written by the broker, not by a socket
		BatchTimeout: time.Millisecond,
		BatchSize:    c.batch,
		WriteTimeout: 5 * time.Second,
	}
	c.sec.kafkaGo(&rc, wt) // its only error, a bad CA file, stopped main
	return kafkahooks.NewReader(rc, readerOpts(c)...), kafkahooks.NewWriter(wt, kafkahooks.WithClientID(c.clientID))
}
