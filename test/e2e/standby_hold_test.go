package e2e

// kcr standby's group hold on the broker with Kafka's production group
// settings (group.initial.rebalance.delay.ms 3000).

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// firstProcessed is when the service first logged a processed record at
// or after t0.
func (s *sbRun) firstProcessed(t0 time.Time) (time.Time, bool) {
	var first time.Time
	for _, e := range s.svcEvents() {
		if e["ev"] != "proc" {
			continue
		}
		at := time.Unix(0, int64(num(e["t"])))
		if !at.Before(t0) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// orderAfter produces n records to topic asleep after kcr standby reported
// standby, waits until they are all processed, and returns how long the
// first took.
func (s *sbRun) orderAfter(topic string, n int, asleep time.Duration) time.Duration {
	s.t.Helper()
	s.waitState("standby", 60*time.Second)
	time.Sleep(asleep)
	t0 := time.Now()
	s.k.produceN(topic, n)
	s.waitAllProcessed(topic, 60*time.Second)
	first, ok := s.firstProcessed(t0)
	if !ok {
		s.t.Fatalf("no record processed after %v", t0)
	}
	return first.Sub(t0)
}

// holdAsleep are the times between the sleep and the orders: at once (the
// restored member joins while the placeholder is still settling), and
// longer than the broker's initial delay.
var holdAsleep = []time.Duration{0, 4 * time.Second}

// holdBound is what the first record may take after the orders: well
// under the broker's initial delay (3 s), which a group that was empty,
// or whose delay a second join re-armed, pays.
const holdBound = 2500 * time.Millisecond

// While the service sleeps, kcr standby holds its classic group with a
// placeholder member that joined before the service's member left, so the
// group is never empty and the restored consumer's join never waits for
// the broker's initial delay: with kafka-go and franz-go (classic group,
// and a custom assignor), orders sent at once after the sleep or later are
// processed once each, the first well within the delay. The placeholder
// leaves at every wake.
func TestStandbyHoldGroup(t *testing.T) {
	for _, c := range []struct {
		name, bin string
		topics    bool
		more      []string
	}{
		{"kafka-go", kafkaBin, true, nil},
		{"franz-go-classic", kgoBin, false, nil},
		{"franz-go-custom-assignor", kgoBin, false, []string{"-balancer", "custom"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafkaProd(t)
			topic, group := k.newTopic("standby-hold", 2), uniqueName("standby-hold")
			flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms"}
			if c.topics {
				// Idle longer than the first join's delay: the service
				// is in its group before it first sleeps.
				flags = append(flags, "--topics", topic, "--idle", "5s")
			} else {
				k.produceN(topic, 4) // the group's commits name its topics
			}
			dir := filepath.Join(t.TempDir(), "img")
			s := k.startStandby(dir, flags, append(consumerArgs(c.bin, k.brokers, topic, group), c.more...)...)
			if c.topics {
				eventually(t, 30*time.Second, "the service in its group", func() (bool, string) {
					d, err := k.describe(group)
					return err == nil && d.State == "Stable", d.State
				})
				k.produceN(topic, 4)
			}
			s.waitAllProcessed(topic, 60*time.Second)
			for i, asleep := range holdAsleep {
				d := s.orderAfter(topic, 5, asleep)
				t.Logf("orders %v after the sleep → first processed by the restored service: %v", asleep, d.Round(time.Millisecond))
				if d >= holdBound {
					t.Errorf("orders %v after the sleep: the first record took %v: the initial rebalance delay (3 s) was not avoided", asleep, d)
				}
				eventually(t, 40*time.Second, "the placeholder gone", func() (bool, string) {
					return s.countLogs("standby: group hold released", "reason", "a member joined") >= i+1, ""
				})
			}
			s.waitState("standby", 60*time.Second)
			if n := s.countLogs("standby: starting"); n != 1 {
				t.Errorf("%d cold starts, want 1", n)
			}
			if n := s.countLogs("standby: group hold failed"); n != 0 {
				t.Errorf("%d failed holds", n)
			}
		})
	}
}

// Two instances of a service in one group, each under its own kcr
// standby, sleep together: the group is held at once (no rounds of
// placeholders that see each other and leave), and orders sent right after
// are processed once each, the first within the bound.
func TestStandbyHoldGroupTwoHolds(t *testing.T) {
	k := needKafkaProd(t)
	topic, group := k.newTopic("standby-hold2", 2), uniqueName("standby-hold2")
	k.produceN(topic, 4)
	flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms"}
	var runs []*sbRun
	for i := range 2 {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("img%d", i))
		runs = append(runs, k.startStandby(dir, flags, kgoBin, "-brokers", k.brokers, "-topic", topic, "-group", group, "-consume", "-client-id", fmt.Sprintf("standby%d", i)))
	}
	for _, s := range runs {
		s.waitState("standby", 90*time.Second)
	}
	t0 := time.Now()
	k.produceN(topic, 6)
	ends := k.endOffsets(topic)
	var first time.Time
	eventually(t, 60*time.Second, "every record processed by one of the services", func() (bool, string) {
		got := map[po]int{}
		first = time.Time{}
		for _, s := range runs {
			for k, n := range processed(s.svcEvents()) {
				got[k] += n
			}
			if f, ok := s.firstProcessed(t0); ok && (first.IsZero() || f.Before(first)) {
				first = f
			}
		}
		n := 0
		for p, end := range ends {
			for o := int64(0); o < end; o++ {
				if got[po{p, o}] > 0 {
					n++
				}
			}
		}
		return n == int(ends[0]+ends[1]), fmt.Sprintf("%d processed", n)
	})
	d := first.Sub(t0)
	t.Logf("orders at once after both slept → first processed: %v", d.Round(time.Millisecond))
	if d >= holdBound {
		t.Errorf("the first record took %v: the initial rebalance delay (3 s) was not avoided", d)
	}
	for i, s := range runs {
		if n := s.countLogs("standby: group hold failed"); n != 0 {
			t.Errorf("standby %d: %d failed holds", i, n)
		}
	}
}

// A KIP-848 group deleted while its service sleeps, and kcr standby
// restarted meanwhile: the hold never joins it (a classic join would
// create it as a classic group, which the KIP-848 member then waits for),
// and the restored member finds its group at once.
func TestStandbyHoldGroupDeletedKIP848(t *testing.T) {
	k := needKafkaProd(t)
	topic, group := k.newTopic("standby-hold848del", 2), uniqueName("standby-hold848del")
	flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms", "--topics", topic}
	dir := filepath.Join(t.TempDir(), "img")
	svc := append(consumerArgs(kgoBin, k.brokers, topic, group), "-balancer", "server")
	s := k.startStandby(dir, flags, svc...)
	k.produceN(topic, 4)
	s.waitAllProcessed(topic, 60*time.Second)
	s.waitState("standby", 60*time.Second)
	s.stop(syscall.SIGTERM)
	eventually(t, 30*time.Second, "the KIP-848 group deleted", func() (bool, string) {
		_, err := k.adm.DeleteGroup(context.Background(), group)
		return err == nil, fmt.Sprint(err)
	})
	s = k.startStandby(dir, flags, svc...)
	d := s.orderAfter(topic, 5, 0)
	t.Logf("orders after the group was deleted → first processed: %v", d.Round(time.Millisecond))
	if d >= holdBound {
		t.Errorf("the first record took %v", d)
	}
	lg, err := k.adm.ListGroupsByType(context.Background(), []string{"consumer"})
	if err != nil || lg[group].GroupType != "consumer" {
		t.Errorf("group %q listed as %+v (%v), want a KIP-848 (consumer) group", group, lg[group], err)
	}
}

// franz-go with KIP-848 (kgo.ServerSideBalancer): the broker has no initial
// delay for such a group, so kcr standby does not hold it, and a classic
// join never converts it; the service goes through its cycles as before.
func TestStandbyHoldGroupSkipsKIP848(t *testing.T) {
	k := needKafkaProd(t)
	topic, group := k.newTopic("standby-hold848", 2), uniqueName("standby-hold848")
	k.produceN(topic, 4)
	flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms"}
	s := k.startStandby(filepath.Join(t.TempDir(), "img"), flags,
		append(consumerArgs(kgoBin, k.brokers, topic, group), "-balancer", "server")...)
	s.waitAllProcessed(topic, 60*time.Second)
	for cycle := 1; cycle <= 2; cycle++ {
		s.waitState("standby", 60*time.Second)
		eventually(t, 20*time.Second, "the hold skipped", func() (bool, string) {
			return s.countLogs("standby: group hold skipped", "reason", "a KIP-848 group (no initial rebalance delay)") >= cycle, ""
		})
		k.produceN(topic, 5)
		s.waitAllProcessed(topic, 60*time.Second)
	}
	if n := s.countLogs("standby: group hold held"); n != 0 {
		t.Errorf("%d holds of a KIP-848 group", n)
	}
	if n := s.countLogs("standby: running", "source", "kafka"); n != 2 {
		t.Errorf("%d restores woken by Kafka lag, want 2", n)
	}
}

// The broker restarts while the group is held (a rolling restart does
// this): a reloaded classic group keeps, for each member, only the
// protocol it selected. The placeholder offers the service's own
// (cooperative-sticky, franz-go's), so the restored member can join and
// is assigned at once. On the broker of scripts/kafka-up.sh, which the
// test restarts: the fault needs no initial delay.
func TestStandbyHoldGroupBrokerRestart(t *testing.T) {
	k := needKafka(t)
	k.restartsBroker()
	topic, group := k.newTopic("standby-holdrestart", 2), uniqueName("standby-holdrestart")
	k.produceN(topic, 4)
	flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms"}
	s := k.startStandby(filepath.Join(t.TempDir(), "img"), flags, consumerArgs(kgoBin, k.brokers, topic, group)...)
	s.waitAllProcessed(topic, 60*time.Second)
	s.waitState("standby", 60*time.Second)
	eventually(t, 20*time.Second, "the group held", func() (bool, string) {
		d, err := k.describe(group)
		return err == nil && d.State == "Stable" && len(d.Members) == 1 && d.Members[0].ClientID == "kcr-standby-hold", d.State
	})
	script(t, "kafka-down.sh")
	script(t, "kafka-up.sh", "KCR_KAFKA_KEEP_DATA=1")
	d := s.orderAfter(topic, 5, 0)
	t.Logf("orders after the broker restarted → first processed: %v", d.Round(time.Millisecond))
	if d >= 10*time.Second {
		t.Errorf("the first record took %v: the restored member could not join the held group", d)
	}
}
