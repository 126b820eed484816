// Command wakeprobe measures how long a scaled-to-zero pipeline takes to
// answer one order, for scripts/bench-standby.sh:
//
//	wakeprobe -brokers B -orders T -results R -cycles N -status 'kcr standby status --image-dir D --json'
//	wakeprobe -brokers B -orders T -results R -cycles N -cold 'CMD that starts the service' -stop 'CMD that stops it'
//
// Each cycle waits until the service is asleep (the -status command prints
// {"state":"standby"}), or, with -cold, until the -stop command has run;
// then it produces one order (examples/loadgen's format) and, with -cold,
// runs the -cold command at once; and it waits until the order's result is
// on the results topic. The latency is from just before the order is
// produced to the moment its result is read (acknowledged by the broker).
//
// -burst N produces N orders per cycle at once; the cycle's latency is then
// to the first of their results (last_ms: to the last).
//
// -in-checkpoint D (with -status) produces each order at a random moment
// within D after a checkpoint began (the status says "checkpointing")
// instead of once the service is asleep: the order either abandons the
// checkpoint (the service resumes) or comes after the image is complete
// (the service is restored). Each cycle's line says which ("restored"),
// and the summary gives both apart.
//
// It prints one JSON line per cycle and a summary line:
// {"cycles","p50_ms","p95_ms","max_ms","missing","duplicated"}, where
// missing counts orders without a result and duplicated the results beyond
// the first of an order, over everything on the results topic.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
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

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated bootstrap brokers")
	orders := flag.String("orders", "orders", "topic of the orders")
	results := flag.String("results", "results", "topic of the results")
	cycles := flag.Int("cycles", 30, "orders to send, one per cycle")
	status := flag.String("status", "", "shell command printing kcr standby status --json")
	cold := flag.String("cold", "", "shell command that starts the service cold (instead of -status)")
	stop := flag.String("stop", "", "with -cold: shell command that stops the service after each cycle")
	prefix := flag.String("prefix", fmt.Sprintf("probe-%d", time.Now().UnixNano()), "order id prefix")
	timeout := flag.Duration("timeout", 60*time.Second, "longest wait for a state or a result")
	asleep := flag.Duration("asleep", 0, "with -status: how long the service stays asleep before each order (a long sleep outlives its group session)")
	create := flag.Int("create", 0, "create -orders and -results with this many partitions, then exit")
	burst := flag.Int("burst", 1, "orders per cycle, produced together")
	inCkpt := flag.Duration("in-checkpoint", 0, "with -status: produce each order at a random moment within this long after a checkpoint begins")
	flag.Parse()
	if *create > 0 {
		createTopics(strings.Split(*brokers, ","), int32(*create), *orders, *results)
		return
	}
	if (*status == "") == (*cold == "") || *burst < 1 || (*inCkpt > 0 && *status == "") {
		fail("give -status or -cold, -burst ≥ 1, and -in-checkpoint only with -status")
	}
	ctx := context.Background()
	bs := strings.Split(*brokers, ",")
	prod, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ClientID("wakeprobe-producer"), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		fail(err.Error())
	}
	defer prod.Close()
	cons, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ClientID("wakeprobe-results"), kgo.ConsumeTopics(*results),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		fail(err.Error())
	}
	defer cons.Close()

	var mu sync.Mutex
	seen := map[string]time.Time{}
	count := map[string]int{}
	arrived := make(chan struct{}, 1)
	go func() {
		for {
			fs := cons.PollFetches(ctx)
			now := time.Now()
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				k := string(r.Key)
				if count[k] == 0 {
					seen[k] = now
				}
				count[k]++
			})
			mu.Unlock()
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
	}()

	var lat []time.Duration
	var ids []string
	phases := map[string][]time.Duration{}  // per wake phase, with -status
	var abandoned, restored []time.Duration // with -in-checkpoint
	for i := range *cycles {
		switch {
		case *inCkpt > 0:
			// Asleep (the first cycle; a checkpoint missed), an order not
			// timed wakes the service, which then goes idle again.
			for {
				err := waitState(*status, "checkpointing", *timeout, "standby")
				if err != errOther {
					if err != nil {
						fail(fmt.Sprintf("cycle %d: %v", i+1, err))
					}
					break
				}
				id := fmt.Sprintf("%s-%d-wake", *prefix, i)
				v, _ := json.Marshal(order.Order{ID: id, N: -1, TS: time.Now().UnixNano()})
				if err := prod.ProduceSync(ctx, &kgo.Record{Topic: *orders, Key: []byte(id), Value: v}).FirstErr(); err != nil {
					fail(fmt.Sprintf("cycle %d: produce: %v", i+1, err))
				}
				ids = append(ids, id)
				if err := waitState(*status, "running", *timeout); err != nil {
					fail(fmt.Sprintf("cycle %d: %v", i+1, err))
				}
			}
			time.Sleep(rand.N(*inCkpt))
		case *status != "":
			if err := waitState(*status, "standby", *timeout); err != nil {
				fail(fmt.Sprintf("cycle %d: %v", i+1, err))
			}
			time.Sleep(*asleep)
		}
		t0 := time.Now()
		var burstIDs []string
		var rs []*kgo.Record
		for j := range *burst {
			id := fmt.Sprintf("%s-%d", *prefix, i)
			if *burst > 1 {
				id = fmt.Sprintf("%s-%d.%d", *prefix, i, j)
			}
			burstIDs = append(burstIDs, id)
			v, _ := json.Marshal(order.Order{ID: id, N: int64(i**burst + j), TS: t0.UnixNano()})
			rs = append(rs, &kgo.Record{Topic: *orders, Key: []byte(id), Value: v})
		}
		ids = append(ids, burstIDs...)
		if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			fail(fmt.Sprintf("cycle %d: produce: %v", i+1, err))
		}
		if *cold != "" {
			if out, err := exec.Command("sh", "-c", *cold).CombinedOutput(); err != nil {
				fail(fmt.Sprintf("cycle %d: -cold: %v: %s", i+1, err, out))
			}
		}
		// The cycle's latency is to the first result; last_ms to the
		// burst's last.
		deadline := time.After(*timeout)
		var first, last time.Time
		for pending := slices.Clone(burstIDs); len(pending) > 0; {
			mu.Lock()
			pending = slices.DeleteFunc(pending, func(id string) bool {
				at := seen[id]
				if !at.IsZero() && (first.IsZero() || at.Before(first)) {
					first = at
				}
				if at.After(last) {
					last = at
				}
				return !at.IsZero()
			})
			mu.Unlock()
			if len(pending) == 0 {
				break
			}
			select {
			case <-arrived:
			case <-time.After(5 * time.Millisecond):
			case <-deadline:
				fail(fmt.Sprintf("cycle %d: no result for %s within %v", i+1, pending[0], *timeout))
			}
		}
		d := first.Sub(t0)
		lat = append(lat, d)
		l := map[string]any{"cycle": i + 1, "order": burstIDs[0], "orders": len(burstIDs), "latency_ms": ms(d), "last_ms": ms(last.Sub(t0))}
		switch {
		case *inCkpt > 0:
			// A restore since the order was sent: it came after the image.
			r := wakePhases(*status, t0) != nil
			l["restored"] = r
			if r {
				restored = append(restored, d)
			} else {
				abandoned = append(abandoned, d)
			}
		case *status != "":
			addPhases(l, phases, *status, t0, d)
		}
		line(l)
		if *stop != "" {
			if out, err := exec.Command("sh", "-c", *stop).CombinedOutput(); err != nil {
				fail(fmt.Sprintf("cycle %d: -stop: %v: %s", i+1, err, out))
			}
		}
	}
	time.Sleep(time.Second) // late duplicates
	mu.Lock()
	missing, dup := 0, 0
	for _, id := range ids {
		switch n := count[id]; {
		case n == 0:
			missing++
		case n > 1:
			dup += n - 1
		}
	}
	mu.Unlock()
	slices.Sort(lat)
	sum := map[string]any{"cycles": len(lat), "p50_ms": ms(pct(lat, 50)), "p95_ms": ms(pct(lat, 95)), "max_ms": ms(lat[len(lat)-1]),
		"missing": missing, "duplicated": dup}
	if len(phases) > 0 {
		sum["phases_p50_ms"] = p50s(phases)
	}
	if *inCkpt > 0 {
		for k, v := range map[string][]time.Duration{"abandoned": abandoned, "restored": restored} {
			sum[k] = len(v)
			if len(v) > 0 {
				slices.Sort(v)
				sum[k+"_p50_ms"], sum[k+"_max_ms"] = ms(pct(v, 50)), ms(v[len(v)-1])
			}
		}
	}
	line(sum)
}

// p50s returns the median of each phase, in ms.
func p50s(phases map[string][]time.Duration) map[string]float64 {
	p50 := map[string]float64{}
	for k, v := range phases {
		slices.Sort(v)
		p50[k] = ms(pct(v, 50))
	}
	return p50
}

// addPhases adds the cycle's wake phases (wakePhases, and its result at d)
// to its line l and to all.
func addPhases(l map[string]any, all map[string][]time.Duration, status string, t0 time.Time, d time.Duration) {
	ph := wakePhases(status, t0)
	if ph == nil {
		return
	}
	ph["result"] = d
	pm := map[string]float64{}
	for k, v := range ph {
		all[k] = append(all[k], v)
		pm[k] = ms(v)
	}
	l["phases_ms"] = pm
}

// wakePhases reads the last wake's phases from kcr standby's status and
// returns them as times from the order's send (t0): detect (the wake
// signal), restored, hooks_done, first_handed (the service's first
// activity: the order handed to it, so its group joined). It waits a
// little for the first activity, which the supervisor polls; nil if the
// status has no wake.
func wakePhases(cmd string, t0 time.Time) map[string]time.Duration {
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		out, err := exec.Command("sh", "-c", cmd).Output()
		var st struct {
			LastWake *struct {
				At              time.Time `json:"at"`
				RestoredMS      float64   `json:"restored_ms"`
				HooksDoneMS     float64   `json:"hooks_done_ms"`
				FirstActivityMS float64   `json:"first_activity_ms"`
			} `json:"last_wake"`
		}
		if err != nil || json.Unmarshal(out, &st) != nil || st.LastWake == nil || st.LastWake.At.Before(t0.Add(-time.Second)) {
			return nil
		}
		w := st.LastWake
		if w.FirstActivityMS == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		detect := w.At.Sub(t0)
		msd := func(x float64) time.Duration { return detect + time.Duration(x*float64(time.Millisecond)) }
		ph := map[string]time.Duration{"detect": detect, "restored": msd(w.RestoredMS), "hooks_done": msd(w.HooksDoneMS)}
		if w.FirstActivityMS > 0 {
			ph["first_handed"] = msd(w.FirstActivityMS)
		}
		return ph
	}
}

// createTopics creates the topics and waits until their partitions have
// leaders.
func createTopics(brokers []string, partitions int32, topics ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		fail(err.Error())
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.CreateTopics(ctx, partitions, 1, nil, topics...)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		fail("create topics: " + err.Error())
	}
	for ctx.Err() == nil {
		ends, err := adm.ListEndOffsets(ctx, topics...)
		n := 0
		if err == nil {
			ends.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					n++
				}
			})
		}
		if n == len(topics)*int(partitions) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fail("topics have no leaders after 30s")
}

// errOther is waitState's error when the status reported the other state.
var errOther = errors.New("the other state")

// waitState runs the status command until it reports state, or, if given,
// other (errOther).
func waitState(cmd, state string, timeout time.Duration, other ...string) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		out, err := exec.Command("sh", "-c", cmd).Output()
		var st struct {
			State string `json:"state"`
		}
		if err == nil && json.Unmarshal(out, &st) == nil {
			switch {
			case st.State == state:
				return nil
			case slices.Contains(other, st.State):
				return errOther
			}
		}
		last = strings.TrimSpace(string(out))
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the service's state was not %s within %v (last status %q)", state, timeout, last)
}

// pct is the p-th percentile of sorted d (nearest rank).
func pct(d []time.Duration, p int) time.Duration {
	i := (p*len(d)+99)/100 - 1
	return d[max(0, min(i, len(d)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func line(m map[string]any) {
	b, _ := json.Marshal(m)
	fmt.Println(string(b))
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "wakeprobe: "+msg)
	os.Exit(1)
}
