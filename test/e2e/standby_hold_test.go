package e2e

// kcr standby's group hold on the broker with Kafka's production group
// settings (group.initial.rebalance.delay.ms 3000).

import (
	"path/filepath"
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

// While the service sleeps, kcr standby holds its classic group with a
// placeholder member, so the restored consumer's join is an ordinary
// rebalance instead of an empty group's first join, which the broker holds
// for 3 s: through three sleep → wake cycles with kafka-go and franz-go
// (classic group), records produced while the service sleeps are processed
// once each, and the first of them well within the 3 s delay of the
// production. The placeholder leaves at every wake.
func TestStandbyHoldGroup(t *testing.T) {
	for _, c := range []struct {
		name, bin string
		topics    bool
	}{
		{"kafka-go", kafkaBin, true},
		{"franz-go-classic", kgoBin, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafkaProd(t)
			topic, group := k.newTopic("standby-hold", 2), uniqueName("standby-hold")
			flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms"}
			if c.topics {
				flags = append(flags, "--topics", topic)
			} else {
				k.produceN(topic, 4) // the group's commits name its topics
			}
			dir := filepath.Join(t.TempDir(), "img")
			s := k.startStandby(dir, flags, consumerArgs(c.bin, k.brokers, topic, group)...)
			if !c.topics {
				s.waitAllProcessed(topic, 60*time.Second)
			}
			for cycle := 1; cycle <= 3; cycle++ {
				s.waitState("standby", 60*time.Second)
				// The placeholder's own first join waits the 3 s delay,
				// while the service sleeps.
				eventually(t, 20*time.Second, "the group held", func() (bool, string) {
					n := s.countLogs("standby: group hold held")
					return n >= cycle, ""
				})
				t0 := time.Now()
				k.produceN(topic, 5)
				s.waitAllProcessed(topic, 60*time.Second)
				first, ok := s.firstProcessed(t0)
				if !ok {
					t.Fatalf("cycle %d: no record processed after %v", cycle, t0)
				}
				d := first.Sub(t0)
				t.Logf("cycle %d: records produced → first processed by the restored service: %v", cycle, d.Round(time.Millisecond))
				if d >= 2500*time.Millisecond {
					t.Errorf("cycle %d: the first record took %v: the initial rebalance delay (3 s) was not avoided", cycle, d)
				}
				eventually(t, 40*time.Second, "the placeholder gone", func() (bool, string) {
					n := s.countLogs("standby: group hold released", "reason", "a member joined")
					return n >= cycle, ""
				})
			}
			s.waitState("standby", 60*time.Second)
			if n := s.countLogs("standby: starting"); n != 1 {
				t.Errorf("%d cold starts, want 1", n)
			}
			if n := s.countLogs("standby: running", "source", "kafka"); n != 3 {
				t.Errorf("%d restores woken by Kafka lag, want 3", n)
			}
			if n := s.countLogs("standby: group hold failed"); n != 0 {
				t.Errorf("%d failed holds", n)
			}
		})
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
