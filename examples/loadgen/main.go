// Command loadgen produces numbered orders at a steady rate with plain
// segmentio/kafka-go:
//
//	loadgen -brokers 127.0.0.1:19092 -topic orders -rate 200/s [-count N]
//
// Order n has key "order-<n>" and a JSON value {"id","n","ts"}. It runs until
// it has produced -count orders or gets SIGTERM/SIGINT, logs progress as JSON
// lines on stderr, and at exit prints the number of the last acknowledged
// order on stdout. Orders are produced in sequence: a batch is retried until
// the broker acknowledges it, so every order up to the printed number is in
// the topic (some possibly twice, if an acknowledgement was lost).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/examples/order"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:19092", "comma-separated bootstrap brokers")
	topic := flag.String("topic", "orders", "topic to produce to")
	rateS := flag.String("rate", "200/s", "orders per second (\"200/s\", \"200\", \"6000/m\")")
	count := flag.Int64("count", 0, "stop after this many orders (0: until SIGTERM)")
	start := flag.Int64("start", 1, "number of the first order")
	every := flag.Duration("log-every", 5*time.Second, "how often to log progress on stderr (0: never)")
	create := flag.String("create-topics", "", "first create these topics if missing, as name:partitions[,name:partitions...] (for a real broker)")
	flag.Parse()

	rate, err := parseRate(*rateS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *create != "" {
		if err := createTopics(ctx, strings.Split(*brokers, ","), *create); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
	}

	w := &kafka.Writer{
		Addr:         kafka.TCP(strings.Split(*brokers, ",")...),
		Topic:        *topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
		MaxAttempts:  3,
	}
	defer w.Close()

	g := &gen{w: w, next: *start, rate: rate, count: *count, t0: time.Now()}
	logf("start", "rate", rate, "count", *count, "topic", *topic)
	err = g.run(ctx, *every)
	logf("done", "acked", g.acked, "last", g.last, "errors", g.errors, "elapsed_ms", time.Since(g.t0).Milliseconds())
	fmt.Println(g.last)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

type gen struct {
	w     *kafka.Writer
	next  int64
	rate  float64
	count int64
	t0    time.Time

	acked  int64 // orders acknowledged
	last   int64 // number of the last acknowledged order
	errors int   // failed write attempts (retried)
}

// run produces on a 10 ms tick whatever the rate says is due, as one batch.
func (g *gen) run(ctx context.Context, every time.Duration) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	var sent int64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due := int64(time.Since(g.t0).Seconds()*g.rate) - sent
		if g.count > 0 && sent+due > g.count {
			due = g.count - sent
		}
		if due > 0 {
			msgs := make([]kafka.Message, due)
			now := time.Now().UnixNano()
			for i := range msgs {
				n := g.next + int64(i)
				o := order.Order{ID: "order-" + strconv.FormatInt(n, 10), N: n, TS: now}
				v, _ := json.Marshal(o)
				msgs[i] = kafka.Message{Key: []byte(o.ID), Value: v}
			}
			if err := g.write(ctx, msgs); err != nil {
				return err
			}
			g.next += due
			sent += due
			g.acked += due
			g.last = g.next - 1
		}
		if every > 0 && time.Since(lastLog) >= every {
			lastLog = time.Now()
			logf("progress", "acked", g.acked, "last", g.last, "errors", g.errors)
		}
		if g.count > 0 && sent >= g.count {
			return nil
		}
	}
}

// write retries a batch until it is acknowledged. After SIGTERM it gives the
// batch in flight a few more seconds, so that the last number is exact.
func (g *gen) write(ctx context.Context, msgs []kafka.Message) error {
	var deadline time.Time
	for {
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := g.w.WriteMessages(wctx, msgs...)
		cancel()
		if err == nil {
			return nil
		}
		g.errors++
		logf("write-error", "err", err.Error(), "first", string(msgs[0].Key))
		if ctx.Err() != nil {
			if deadline.IsZero() {
				deadline = time.Now().Add(5 * time.Second)
			} else if time.Now().After(deadline) {
				return errors.New("giving up on the last batch after SIGTERM: " + err.Error())
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func parseRate(s string) (float64, error) {
	num, unit, _ := strings.Cut(strings.TrimSpace(s), "/")
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("-rate %q: want a positive number like 200/s", s)
	}
	switch unit {
	case "", "s":
	case "m":
		v /= 60
	case "ms":
		v *= 1000
	default:
		return 0, fmt.Errorf("-rate %q: unit must be s, m or ms", s)
	}
	return v, nil
}

var enc = json.NewEncoder(os.Stderr)

func logf(ev string, kv ...any) {
	m := map[string]any{"ev": ev, "src": "loadgen", "t": time.Now().UnixNano()}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	enc.Encode(m)
}

// createTopics creates the topics of spec (name:partitions,...) with one
// replica; a topic that exists already is left as it is.
func createTopics(ctx context.Context, brokers []string, spec string) error {
	var req kafka.CreateTopicsRequest
	for _, t := range strings.Split(spec, ",") {
		name, ps, ok := strings.Cut(t, ":")
		n, err := strconv.Atoi(ps)
		if !ok || name == "" || err != nil || n < 1 {
			return fmt.Errorf("-create-topics: %q is not name:partitions", t)
		}
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: name, NumPartitions: n, ReplicationFactor: 1})
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	res, err := cl.CreateTopics(ctx, &req)
	if err != nil {
		return fmt.Errorf("creating topics %s: %w", spec, err)
	}
	for name, err := range res.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("creating topic %s: %w", name, err)
		}
	}
	return nil
}
