// Command replicabench measures replicas of the demo pipeline under kcr
// standby --replicas, for scripts/bench-standby-replicas.sh:
//
//	replicabench -brokers B -orders T -results R -group G -kcr KCR -dirs D1,D2,D3 -burst 20 -rate 125 -load 30s
//
// The replicas run already (each kcr standby with its --image-dir in
// -dirs). It waits until all sleep, then:
//
//  1. burst: -burst orders at once; the first result's latency, and how
//     many replicas ran (were restoring or running) until all slept again;
//  2. load: -rate orders/s for -load; the time until every replica ran at
//     once, the changes of the group's member set (each is one rebalance),
//     and the highest order → result latency (the oldest order's age when
//     its result came: the highest lag age);
//  3. stop: the time from the last order to every replica asleep.
//
// With -cycles N it measures collective sleeps instead: N times, every
// replica is woken by hand (kcr standby wake), all fall asleep together
// once idle, and one order is sent at once; that order's first result's
// latency each time (p50, p95, max).
//
// Orders are examples/loadgen's ({"id","n","ts"}); every result read back is
// matched to its order: missing and duplicated over the whole run. It
// prints one JSON line.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/examples/order"
)

// bench is one run.
type bench struct {
	kcr     string
	dirs    []string
	orders  string
	prod    *kgo.Client
	adm     *kadm.Client
	group   string
	timeout time.Duration

	mu      sync.Mutex
	sent    map[string]time.Time
	got     map[string]int
	latency map[string]time.Duration // order → its first result
}

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	orders := flag.String("orders", "orders", "topic of the orders")
	results := flag.String("results", "results", "topic of the results")
	group := flag.String("group", "", "the pipeline's consumer group")
	kcr := flag.String("kcr", "kcr", "the kcr binary (for kcr standby status)")
	dirs := flag.String("dirs", "", "comma-separated --image-dir of the replicas' kcr standby")
	burst := flag.Int("burst", 20, "orders of the burst")
	rate := flag.Int("rate", 125, "orders per second of the load")
	load := flag.Duration("load", 30*time.Second, "how long the load lasts")
	timeout := flag.Duration("timeout", 3*time.Minute, "longest wait for a state or the results")
	cycles := flag.Int("cycles", 0, "collective sleeps to measure instead of the burst and the load (0: none)")
	flag.Parse()
	if *group == "" || *dirs == "" || *rate < 1 || *burst < 1 {
		fail("give -group, -dirs, -rate ≥ 1 and -burst ≥ 1")
	}
	bs := strings.Split(*brokers, ",")
	prod, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ClientID("replicabench-producer"), kgo.DefaultProduceTopic(*orders),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		fail(err.Error())
	}
	defer prod.Close()
	cons, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ClientID("replicabench-results"), kgo.ConsumeTopics(*results),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		fail(err.Error())
	}
	defer cons.Close()
	b := &bench{kcr: *kcr, dirs: strings.Split(*dirs, ","), orders: *orders, prod: prod, adm: kadm.NewClient(prod), group: *group,
		timeout: *timeout, sent: map[string]time.Time{}, got: map[string]int{}, latency: map[string]time.Duration{}}
	go b.read(cons)
	out := map[string]any{}
	b.waitAll("standby", "the replicas asleep before the burst")
	if *cycles > 0 {
		b.collective(out, *cycles)
	} else {
		b.burst(out, *burst)
		b.load(out, *rate, *load)
	}
	time.Sleep(time.Second) // late duplicates
	b.mu.Lock()
	missing, dup := 0, 0
	for id := range b.sent {
		switch n := b.got[id]; {
		case n == 0:
			missing++
		case n > 1:
			dup += n - 1
		}
	}
	out["orders"], out["missing"], out["duplicated"] = len(b.sent), missing, dup
	b.mu.Unlock()
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}

// read records every result as it arrives.
func (b *bench) read(cons *kgo.Client) {
	for {
		fs := cons.PollFetches(context.Background())
		if fs.IsClientClosed() {
			return
		}
		now := time.Now()
		b.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			id := string(r.Key)
			if b.got[id] == 0 {
				if at, ok := b.sent[id]; ok {
					b.latency[id] = now.Sub(at)
				}
			}
			b.got[id]++
		})
		b.mu.Unlock()
	}
}

// send produces one order; sync waits for its acknowledgement.
func (b *bench) send(id string, n int64, sync bool) {
	now := time.Now()
	v, _ := json.Marshal(order.Order{ID: id, N: n, TS: now.UnixNano()})
	b.mu.Lock()
	b.sent[id] = now
	b.mu.Unlock()
	r := &kgo.Record{Key: []byte(id), Value: v}
	if sync {
		if err := b.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			fail("produce: " + err.Error())
		}
		return
	}
	b.prod.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
		if err != nil {
			fail("produce: " + err.Error())
		}
	})
}

// states are the replicas' states now ("" where the status failed).
func (b *bench) states() []string {
	out := make([]string, len(b.dirs))
	for i, d := range b.dirs {
		o, err := exec.Command(b.kcr, "standby", "status", "--image-dir", d, "--json").Output()
		var st struct {
			State string `json:"state"`
		}
		if err == nil && json.Unmarshal(o, &st) == nil {
			out[i] = st.State
		}
	}
	return out
}

func awake(s string) bool { return s == "running" || s == "restoring" || s == "checkpointing" }

// waitAll waits until every replica is in state, and returns when.
func (b *bench) waitAll(state, what string) time.Time {
	deadline := time.Now().Add(b.timeout)
	for time.Now().Before(deadline) {
		if sts := b.states(); !slices.ContainsFunc(sts, func(s string) bool { return s != state }) {
			return time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	fail("timed out waiting for " + what)
	return time.Time{}
}

// waitResults waits until every order sent has a result.
func (b *bench) waitResults(what string) {
	deadline := time.Now().Add(b.timeout)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		n := 0
		for id := range b.sent {
			if b.got[id] == 0 {
				n++
			}
		}
		b.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	fail("timed out waiting for the results of " + what)
}

// burst sends n orders to the sleeping replicas.
func (b *bench) burst(out map[string]any, n int) {
	ran := make([]bool, len(b.dirs))
	stop := b.watch(func(sts []string) {
		for i, s := range sts {
			ran[i] = ran[i] || awake(s)
		}
	})
	t0 := time.Now()
	for i := range n {
		b.send(fmt.Sprintf("burst-%d-%d", t0.UnixNano(), i), int64(i), true)
	}
	b.waitResults("the burst")
	b.waitAll("standby", "the replicas asleep after the burst")
	stop()
	first := b.firstLatency(t0)
	woke := 0
	for _, r := range ran {
		if r {
			woke++
		}
	}
	out["burst_orders"], out["burst_first_result_ms"], out["burst_replicas_woken"] = n, ms(first), woke
}

// firstLatency is the lowest latency of the orders sent since t0.
func (b *bench) firstLatency(t0 time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	first := time.Duration(-1)
	for id, at := range b.sent {
		if l, ok := b.latency[id]; ok && !at.Before(t0) && (first < 0 || l < first) {
			first = l
		}
	}
	return first
}

// collective wakes every replica by hand, waits until all sleep again
// (together: none has work), and sends one order, n times: the order's
// first result's latency each time.
func (b *bench) collective(out map[string]any, n int) {
	var lat []float64
	for c := range n {
		for _, d := range b.dirs {
			if o, err := exec.Command(b.kcr, "standby", "wake", "--image-dir", d).CombinedOutput(); err != nil {
				fail(fmt.Sprintf("kcr standby wake --image-dir %s: %v: %s", d, err, o))
			}
		}
		b.waitAll("running", "every replica running after kcr standby wake")
		b.waitAll("standby", "the replicas asleep together")
		t0 := time.Now()
		b.send(fmt.Sprintf("collective-%d-%d", t0.UnixNano(), c), int64(c), true)
		b.waitResults("the order after a collective sleep")
		lat = append(lat, ms(b.firstLatency(t0)))
		b.waitAll("standby", "the replicas asleep after the order")
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return lat[max(0, int(math.Ceil(p*float64(len(lat))))-1)] } // nearest rank
	out["cycles"], out["collective_first_result_ms"] = n, lat
	out["collective_p50_ms"], out["collective_p95_ms"], out["collective_max_ms"] = q(0.5), q(0.95), lat[len(lat)-1]
}

// watch calls f with the replicas' states every 100 ms until stop.
func (b *bench) watch(f func([]string)) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			f(b.states())
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() { close(done); <-finished }
}

// load sends rate orders/s for d, then stops.
func (b *bench) load(out map[string]any, rate int, d time.Duration) {
	t0 := time.Now()
	var allAt time.Duration = -1
	maxAwake := 0
	stop := b.watch(func(sts []string) {
		n := 0
		for _, s := range sts {
			if s == "running" {
				n++
			}
		}
		maxAwake = max(maxAwake, n)
		if n == len(sts) && allAt < 0 {
			allAt = time.Since(t0)
		}
	})
	rebalances, stopGroup := b.memberChanges()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for i := 0; time.Since(t0) < d; i++ {
		<-tick.C
		b.send(fmt.Sprintf("load-%d-%d", t0.UnixNano(), i), int64(i), false)
	}
	tick.Stop()
	if err := b.prod.Flush(context.Background()); err != nil {
		fail("flush: " + err.Error())
	}
	last := time.Now()
	b.waitResults("the load")
	drained := time.Since(last)
	asleep := b.waitAll("standby", "the replicas asleep after the load").Sub(last)
	stop()
	changes := stopGroup()
	var highest time.Duration
	b.mu.Lock()
	for id, at := range b.sent {
		if !at.Before(t0) {
			highest = max(highest, b.latency[id])
		}
	}
	b.mu.Unlock()
	out["load_rate"], out["load_s"] = rate, d.Seconds()
	out["load_all_running_ms"], out["load_most_running"] = ms(allAt), maxAwake
	out["load_member_changes"], out["load_highest_lag_age_ms"] = rebalances(changes), ms(highest)
	out["stop_results_drained_ms"], out["stop_all_asleep_ms"] = ms(drained), ms(asleep)
}

// memberChanges watches the group's member set every 100 ms until stop,
// which returns the sets seen in turn.
func (b *bench) memberChanges() (count func([]string) int, stop func() []string) {
	var seen []string
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ds, err := b.adm.DescribeGroups(ctx, b.group)
			cancel()
			if d, ok := ds[b.group]; err == nil && ok && d.Err == nil {
				var ids []string
				for _, m := range d.Members {
					ids = append(ids, m.MemberID)
				}
				slices.Sort(ids)
				set := strings.Join(ids, ",")
				if len(seen) == 0 || seen[len(seen)-1] != set {
					seen = append(seen, set)
				}
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func(s []string) int { return max(0, len(s)-1) }, func() []string { close(done); <-finished; return seen }
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "replicabench:", msg)
	os.Exit(1)
}
