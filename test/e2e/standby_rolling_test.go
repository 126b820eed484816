package e2e

// A rolling restart under kcr standby: each cycle is a rollout's SIGTERM to
// kcr standby, run as init of its own PID namespace (a container's
// entrypoint), then the next kcr standby started on the same image
// directory, with an order waiting for it.

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// rollingCycles is how many restarts TestStandbyRollingRestart makes.
const rollingCycles = 20

// 20 rolling restarts on the broker with Kafka's production group settings,
// with each client's fast path there (kafka-go with the group handover,
// franz-go with KIP-848): every SIGTERM checkpoints the running consumer
// (the default --on-term), every next start restores it warm on the order
// that waited (kcr standby logs no cold start, and one Kafka wake), every
// order is processed once (the service's log), and after each cycle the
// group's commits, read by the test's own admin client, reach the end of
// the topic: 0 missing, 0 duplicated. SIGTERM → exit and start → first
// record are logged per cycle, with their medians.
func TestStandbyRollingRestart(t *testing.T) {
	for _, c := range []struct {
		name, bin string
		extra     []string // the service's own flags
	}{
		{"kafka-go-handover-prod", kafkaBin, []string{"-group-handover"}},
		{"franz-go-kip848-prod", kgoBin, []string{"-balancer", "server"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafkaProd(t)
			topic, group := k.newTopic("standby-rolling", 2), uniqueName("standby-rolling")
			flags := []string{"--idle", "1h", "--group", group, "--topics", topic}
			svc := append(consumerArgs(c.bin, k.brokers, topic, group), c.extra...)
			dir := filepath.Join(t.TempDir(), "img")
			abs, _ := filepath.Abs(dir)

			// The first start is cold: no image yet.
			s := k.startStandbyInit(dir, flags, svc...)
			s.waitState("running", 60*time.Second)
			k.produceN(topic, 1)
			s.waitAllProcessed(topic, 60*time.Second)
			var terms, firsts []time.Duration
			warm := 0
			for cycle := 1; cycle <= rollingCycles; cycle++ {
				s.waitState("running", 60*time.Second)
				d, err := s.term(60 * time.Second)
				if err != nil {
					t.Fatalf("cycle %d: kcr standby exited with %v after SIGTERM, want 0", cycle, err)
				}
				terms = append(terms, d)
				if n := s.countLogs("standby: shutdown: the service is checkpointed; the next start restores it"); n != 1 {
					t.Fatalf("cycle %d: %d checkpoints at shutdown logged, want 1", cycle, n)
				}
				if ms := procfs.NamespaceInitsWith("KCR_STANDBY_DIR=" + abs); len(ms) != 0 {
					t.Fatalf("cycle %d: copies of the service run after kcr standby exited: %v", cycle, ms)
				}
				// The order waits while nothing runs, as during a rollout.
				k.produceN(topic, 1)
				t0 := time.Now()
				s = k.startStandbyInit(dir, flags, svc...)
				s.waitAllProcessed(topic, 60*time.Second)
				first, ok := s.firstProcessed(t0)
				if !ok {
					t.Fatalf("cycle %d: no record processed after the start", cycle)
				}
				firsts = append(firsts, first.Sub(t0))
				cold := s.countLogs("standby: starting")
				wakes := s.countLogs("standby: running", "source", "kafka")
				if cold == 0 && wakes == 1 {
					warm++
				} else {
					t.Errorf("cycle %d: %d cold starts and %d restores woken by the order, want 0 and 1", cycle, cold, wakes)
				}
				k.waitCommitted(group, topic, k.endOffsets(topic), 60*time.Second)
			}
			if warm != rollingCycles {
				t.Errorf("%d warm starts in %d restarts, want %d", warm, rollingCycles, rollingCycles)
			}
			t.Logf("%d restarts, %d warm: SIGTERM → checkpointed and exited median %v (all %v); start → first record median %v (all %v)",
				rollingCycles, warm, medianOf(terms), roundAll(terms), medianOf(firsts), roundAll(firsts))
		})
	}
}

// medianOf is the median of ds (the upper one of an even count).
func medianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

func roundAll(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return fmt.Sprint(out)
}
