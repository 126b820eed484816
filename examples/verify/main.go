// Command verify checks a pipeline run independently of the pipeline: with
// its own franz-go client it reads the orders and results topics from the
// beginning until it has caught up, and reports how many orders were
// produced, how many have a result, which have none, and how many results are
// duplicates.
//
//	verify -brokers 127.0.0.1:19092 [-wait 20s] [-json]
//
// With -wait it keeps reading new results until every order has one or the
// wait is over. It exits 0 if every order has a result, 1 if some are missing,
// 2 on errors.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:19092", "comma-separated bootstrap brokers")
	orders := flag.String("orders", "orders", "topic of the orders")
	results := flag.String("results", "results", "topic of the results")
	wait := flag.Duration("wait", 0, "after catching up, keep reading until every order has a result or this much time has passed")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	jsonFile := flag.String("json-file", "", "also write the report as JSON to this file")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	t, err := read(ctx, strings.Split(*brokers, ","), *orders, *results, *wait)
	if err != nil {
		fmt.Fprintln(os.Stderr, "verify:", err)
		os.Exit(2)
	}
	rep := t.Report()
	if *jsonFile != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonFile, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "verify:", err)
			os.Exit(2)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printText(os.Stdout, rep)
	}
	if !rep.OK {
		os.Exit(1)
	}
}

type tp struct {
	topic     string
	partition int32
}

// read consumes both topics from their start to their end offsets.
func read(ctx context.Context, brokers []string, orders, results string, wait time.Duration) (*Tally, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("kcr-verify"))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	r := &reader{cl: cl, adm: kadm.NewClient(cl), orders: orders, results: results, pos: map[tp]int64{}, ends: map[tp]int64{}}
	if err := r.fromStart(ctx); err != nil {
		return nil, err
	}
	if err := r.listEnds(ctx); err != nil {
		return nil, err
	}
	t := NewTally()
	var waitUntil time.Time
	for {
		if r.caughtUp() {
			if waitUntil.IsZero() {
				waitUntil = time.Now().Add(wait)
			}
			if t.Missing() == 0 || !time.Now().Before(waitUntil) {
				return t, nil
			}
			if err := r.listEnds(ctx); err != nil {
				return nil, err
			}
			if r.caughtUp() {
				time.Sleep(100 * time.Millisecond)
				continue
			}
		}
		if err := r.poll(ctx, t); err != nil {
			return nil, err
		}
	}
}

// reader reads the orders and results topics: pos is the next offset to
// read of each partition, ends its end offset when last listed.
type reader struct {
	cl              *kgo.Client
	adm             *kadm.Client
	orders, results string
	pos, ends       map[tp]int64
}

// fromStart has the client consume every partition of both topics from
// its start offset.
func (r *reader) fromStart(ctx context.Context) error {
	starts, err := r.adm.ListStartOffsets(ctx, r.orders, r.results)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets: %w", err)
	}
	consume := map[string]map[int32]kgo.Offset{}
	starts.Each(func(o kadm.ListedOffset) {
		r.pos[tp{o.Topic, o.Partition}] = o.Offset
		if consume[o.Topic] == nil {
			consume[o.Topic] = map[int32]kgo.Offset{}
		}
		consume[o.Topic][o.Partition] = kgo.NewOffset().At(o.Offset)
	})
	for _, topic := range []string{r.orders, r.results} {
		if len(consume[topic]) == 0 {
			return fmt.Errorf("topic %q does not exist or has no partitions", topic)
		}
	}
	r.cl.AddConsumePartitions(consume)
	return nil
}

// listEnds lists the end offsets of both topics' partitions.
func (r *reader) listEnds(ctx context.Context) error {
	e, err := r.adm.ListEndOffsets(ctx, r.orders, r.results)
	if err == nil {
		err = e.Error()
	}
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	e.Each(func(o kadm.ListedOffset) { r.ends[tp{o.Topic, o.Partition}] = o.Offset })
	return nil
}

// caughtUp is whether every partition is read up to its end offset.
func (r *reader) caughtUp() bool {
	for k, end := range r.ends {
		if r.pos[k] < end {
			return false
		}
	}
	return true
}

// poll fetches for up to half a second and adds what came to t.
func (r *reader) poll(ctx context.Context, t *Tally) error {
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	fs := r.cl.PollFetches(pctx)
	cancel()
	if ctx.Err() != nil {
		return fmt.Errorf("reading did not catch up in time: %w", ctx.Err())
	}
	var ferr error
	fs.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			ferr = fmt.Errorf("fetch %s/%d: %w", topic, p, err)
		}
	})
	if ferr != nil {
		return ferr
	}
	fs.EachRecord(func(kr *kgo.Record) {
		k := tp{kr.Topic, kr.Partition}
		if kr.Offset+1 > r.pos[k] {
			r.pos[k] = kr.Offset + 1
		}
		rec := Record{Partition: kr.Partition, Offset: kr.Offset, Key: string(kr.Key), Value: kr.Value, Timestamp: kr.Timestamp}
		if len(kr.Headers) > 0 {
			rec.Headers = make(map[string]string, len(kr.Headers))
			for _, h := range kr.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
		}
		if kr.Topic == r.orders {
			t.AddOrder(rec)
		} else {
			t.AddResult(rec)
		}
	})
	return nil
}

func printText(w io.Writer, r Report) {
	fmt.Fprintf(w, "orders      %d", r.Orders)
	if r.DupOrders > 0 {
		fmt.Fprintf(w, " (%d records, %d resent by the producer)", r.OrderRecords, r.DupOrders)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "results     %d orders have a result (%d records)\n", r.Results, r.ResultRecords)
	fmt.Fprintf(w, "missing     %d", r.Missing)
	if r.Missing > 0 {
		fmt.Fprintf(w, "  first: %s", strings.Join(r.MissingFirst, " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "duplicates  %d", r.Duplicates)
	if r.Duplicates > 0 {
		fmt.Fprintf(w, "  first: %s", strings.Join(r.DupFirst, " "))
	}
	fmt.Fprintln(w)
	if r.Unexpected > 0 || r.Undecoded > 0 {
		fmt.Fprintf(w, "unexpected  %d results for unknown orders, %d undecodable\n", r.Unexpected, r.Undecoded)
	}
	if r.SeqMax > 0 {
		fmt.Fprintf(w, "sequence    1..%d, %d gaps, %d repeats\n", r.SeqMax, r.SeqGaps, r.SeqRepeat)
	}
	for _, in := range r.Instances {
		fmt.Fprintf(w, "instance    %s gen %d pid %v: %d results, seq %d..%d, %s .. %s\n",
			short(in.ID), in.Generation, in.PIDs, in.Results, in.SeqMin, in.SeqMax,
			in.First.Format("15:04:05.000"), in.Last.Format("15:04:05.000"))
	}
	verdict := "PASS"
	if !r.OK {
		verdict = "FAIL"
	}
	fmt.Fprintln(w, verdict)
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	if id == "" {
		return "?"
	}
	return id
}
