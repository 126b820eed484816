package e2e

// Three replicas of one service, each under its own kcr standby --replicas
// with the same group, on the broker with Kafka's production group
// settings.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// replicaRig is three kcr standby --replicas of kgoapp -consume with a
// known capacity (-proc-delay), in one classic group.
type replicaRig struct {
	t     *testing.T
	k     *kafkaEnv
	topic string
	group string
	flags []string
	svc   []string
	dirs  []string
	runs  []*sbRun
}

// replicaScaleUp is the replicas' --scale-up-after.
const replicaScaleUp = 3 * time.Second

func newReplicaRig(t *testing.T) *replicaRig {
	k := needKafkaProd(t)
	r := &replicaRig{t: t, k: k, topic: k.newTopic("standby-replicas", 6), group: uniqueName("standby-replicas")}
	r.flags = []string{"--idle", "2s", "--group", r.group, "--topics", r.topic, "--replicas",
		"--replicas-topic", uniqueName("kcr-claims"), "--scale-up-after", replicaScaleUp.String(),
		// A rebalance waits for the records in hand to be committed: a
		// partition that moves is not processed twice.
		"-e", "KGOAPP_CONSUME_OPTS=block-rebalance"}
	// 50 records/s each.
	r.svc = append(consumerArgs(kgoBin, k.brokers, r.topic, r.group), "-proc-delay", "20ms")
	for i := range 3 {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("replica%d", i))
		r.dirs = append(r.dirs, dir)
		r.runs = append(r.runs, k.startStandby(dir, r.flags, r.svc...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			r.timeline()
		}
	})
	return r
}

// allAsleep waits until every replica sleeps.
func (r *replicaRig) allAsleep(what string) {
	r.t.Helper()
	for i, s := range r.runs {
		st := s.waitState("standby", 90*time.Second)
		if st.Replica == nil {
			r.t.Fatalf("%s: replica %d reports no replica status", what, i)
		}
	}
}

// running are the indexes of the replicas whose service runs.
func (r *replicaRig) running() []int {
	var out []int
	for i, s := range r.runs {
		if st, err := s.status(); err == nil && (st.State == "running" || st.State == "restoring") {
			out = append(out, i)
		}
	}
	return out
}

// kafkaWakes counts each replica's restores woken by Kafka.
func (r *replicaRig) kafkaWakes() []int {
	out := make([]int, len(r.runs))
	for i, s := range r.runs {
		out[i] = s.countLogs("standby: running", "source", "kafka")
	}
	return out
}

// processed is how often each record was processed, over every replica.
func (r *replicaRig) processed() map[po]int {
	got := map[po]int{}
	for _, s := range r.runs {
		for k, n := range processed(s.svcEvents()) {
			got[k] += n
		}
	}
	return got
}

// waitProcessed waits until every record of the topic was processed.
func (r *replicaRig) waitProcessed(timeout time.Duration) {
	r.t.Helper()
	ends := r.k.endOffsets(r.topic)
	eventually(r.t, timeout, "every record processed by a replica", func() (bool, string) {
		got, missing := r.processed(), 0
		for p, end := range ends {
			for o := int64(0); o < end; o++ {
				if got[po{p, o}] == 0 {
					missing++
				}
			}
		}
		return missing == 0, fmt.Sprintf("%d missing", missing)
	})
}

func sum(ns []int) int {
	n := 0
	for _, x := range ns {
		n += x
	}
	return n
}

// Three replicas under kcr standby --replicas: idle, all sleep, and the
// group is held for the next wake; a burst
// wakes exactly one; a replica killed (kcr standby and its service, as a
// host that is gone) while work waits is replaced by a sleeping one; a
// sustained load at 2.5× one replica's capacity wakes the other two, one
// at a time, --scale-up-after apart at least; when it stops, all sleep.
// Every record is processed, and only the killed replica's uncommitted
// ones twice.
func TestStandbyReplicas(t *testing.T) {
	r := newReplicaRig(t)
	r.allAsleep("idle")
	// They went idle together (all started together): the group is held
	// all the same, by one placeholder, and nothing else.
	eventually(t, 30*time.Second, "the group held by one placeholder", func() (bool, string) {
		d, err := r.k.describe(r.group)
		held := err == nil && len(d.Members) == 1
		for _, m := range d.Members {
			held = held && m.ClientID == "kcr-standby-hold"
		}
		return held, fmt.Sprintf("state %s, %d members, err %v", d.State, len(d.Members), err)
	})

	// One burst: one replica wakes, the others stay asleep.
	r.k.produceN(r.topic, 20)
	r.waitProcessed(60 * time.Second)
	if w := r.kafkaWakes(); sum(w) != 1 {
		t.Errorf("a burst to the sleeping group woke %v replicas (by replica), want exactly one", w)
	}
	r.allAsleep("after the burst")

	// A running replica killed with its service while work waits: a
	// sleeping one takes over.
	before := r.kafkaWakes()
	var procBefore []int
	for _, s := range r.runs {
		procBefore = append(procBefore, len(processed(s.svcEvents())))
	}
	r.k.produceN(r.topic, 150) // 3 s of one replica's work
	x := -1
	eventually(t, 30*time.Second, "a replica woken and processing", func() (bool, string) {
		for i, s := range r.runs {
			if len(processed(s.svcEvents())) > procBefore[i] && r.kafkaWakes()[i] > before[i] && s.statePID() > 0 {
				x = i
				return true, ""
			}
		}
		return false, fmt.Sprint(r.running())
	})
	pid := r.runs[x].statePID()
	r.runs[x].cmd.Process.Kill()
	<-r.runs[x].done
	r.runs[x].done <- nil
	killWait(pid)
	killed := time.Now()
	uncommitted := r.processed() // what the killed replica processed...
	committed, err := r.k.committed(r.group, r.topic)
	if err != nil {
		t.Fatal(err)
	}
	r.waitProcessed(90 * time.Second)
	after := r.kafkaWakes()
	took := false
	for i := range after {
		took = took || (i != x && after[i] > before[i])
	}
	if !took {
		t.Errorf("replica %d killed: no sleeping replica woke (wakes %v → %v)", x, before, after)
	}
	t.Logf("replica %d killed: the rest processed %v later", x, time.Since(killed).Round(time.Millisecond))
	r.runs[x] = r.k.startStandby(r.dirs[x], r.flags, r.svc...) // it starts cold
	r.allAsleep("after the takeover")

	// Sustained overload: all three run, woken one at a time.
	wakes0 := r.kafkaWakes()
	loadAt := time.Now()
	prod := r.k.produce(r.topic, 125)
	eventually(t, 60*time.Second, "all three replicas running", func() (bool, string) {
		run := r.running()
		return len(run) == 3, fmt.Sprint(run)
	})
	time.Sleep(2 * time.Second)
	prod.finish()
	r.waitProcessed(90 * time.Second)
	r.allAsleep("after the load")
	var ups []time.Time
	for _, s := range r.runs {
		for _, m := range s.logs() {
			at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(m["time"]))
			if m["msg"] == "standby: replica scaled_up" && at.After(loadAt) {
				ups = append(ups, at)
			}
		}
	}
	t.Logf("overload: wakes by replica %v → %v; scale-ups at %v", wakes0, r.kafkaWakes(), ups)
	if len(ups) < 2 {
		t.Errorf("%d scale-ups under the overload, want 2 at least", len(ups))
	}
	for i := 1; i < len(ups); i++ {
		for j := range i {
			if d := ups[i].Sub(ups[j]).Abs(); d < replicaScaleUp {
				t.Errorf("two scale-ups %v apart: want one at a time, %v apart at least", d, replicaScaleUp)
			}
		}
	}

	// Nothing lost (waitProcessed); nothing twice but what the killed
	// replica processed and had not committed.
	for k, n := range r.processed() {
		if n > 1 && !(uncommitted[k] > 0 && k.o >= committed[k.p]) {
			t.Errorf("partition %d offset %d processed %d times", k.p, k.o, n)
		}
	}
	for i, s := range r.runs {
		if n := s.countLogs("standby: group hold failed"); n != 0 {
			t.Errorf("replica %d: %d failed holds", i, n)
		}
	}
}

// timeline logs the replicas' decisions and transitions: what a failure
// needs to be read.
func (r *replicaRig) timeline() {
	for i, s := range r.runs {
		for _, m := range s.logs() {
			msg := fmt.Sprint(m["msg"])
			if strings.Contains(msg, "replica") || strings.Contains(msg, "standby: running") || strings.Contains(msg, "standby: standby") || strings.Contains(msg, "hold") || strings.Contains(msg, "kafka work") {
				r.t.Logf("replica %d %v %s why=%v source=%v live=%v oldest_ms=%v", i, m["time"], msg, m["why"], m["source"], m["live_members"], m["oldest_age_ms"])
			}
		}
	}
}
