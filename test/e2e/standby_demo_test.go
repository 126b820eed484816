package e2e

// kcr standby's demo script, and the group's offsets vanishing while the
// service sleeps under kcr standby.

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// scripts/demo-standby.sh passes (it exits non-zero on any failure: a wake
// that does not answer, a cold start too many, an order missing or
// answered twice): on kfake with franz-go's KIP-848 group (its default) and
// kafka-go's group handover, and on the broker with production group
// settings.
func TestStandbyDemoScript(t *testing.T) {
	for _, c := range []struct{ name, client, broker string }{
		{"kfake/franz-848", "franz-848", "kfake"},
		{"kfake/kafka-go-handover", "kafka-go-handover", "kfake"},
		{"kafka/franz-848", "franz-848", "kafka"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := []string{"KCR_DEMO_CLIENT=" + c.client, "KCR_DEMO_BROKER=" + c.broker}
			if c.broker == "kafka" {
				env = append(env, "KCR_KAFKA_PROD_BROKERS="+needKafkaProd(t).brokers)
			} else {
				need(t)
			}
			script(t, "demo-standby.sh", env...)
		})
	}
}

// The group's committed offsets vanish while the service sleeps under kcr
// standby: deleted (kadm DeleteOffsets), or the group deleted (what their
// expiry does to an empty group). kcr standby neither wakes the service for
// it nor stops watching (without --topics the topics came from those
// commits); the next records wake it, and the restored consumer goes on
// from the offsets its image recorded (kgohooks' rule for offsets gone, and
// kafkahooks' with a WithOffsetsCheckAfter shorter than the sleep): every
// record processed once, none twice. Then it sleeps and wakes as before.
func TestStandbyOffsetsGone(t *testing.T) {
	for _, c := range []struct {
		name   string
		bin    string
		args   []string // the consumer's flags
		topics bool     // --topics given
		group  bool     // delete the group, not the offsets
	}{
		{"franz-go-kip848/group-deleted/topics-from-commits", kgoBin, []string{"-balancer", "server"}, false, true},
		{"franz-go-classic/offsets-deleted/topics-given", kgoBin, nil, true, false},
		{"kafka-go/group-deleted/topics-given", kafkaBin, []string{"-offsets-check-after", "0s"}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := needKafka(t)
			topic, group := k.newTopic("standby-gone", 2), uniqueName("standby-gone")
			// A held group is not empty: the broker refuses to delete it
			// or its offsets (NON_EMPTY_GROUP) while the service sleeps.
			flags := []string{"--idle", "1s", "--group", group, "--poll", "100ms", "--hold-group=false"}
			if c.topics {
				flags = append(flags, "--topics", topic)
			}
			k.produceN(topic, 4) // the group's first commits
			svc := append(consumerArgs(c.bin, k.brokers, topic, group), c.args...)
			s := k.startStandby(filepath.Join(t.TempDir(), "img"), flags, svc...)
			s.waitAllProcessed(topic, 60*time.Second)
			s.waitState("standby", 60*time.Second)
			if got, err := k.committed(group, topic); err != nil || len(got) != 2 {
				t.Fatalf("committed offsets before they vanish: %v (%v), want both partitions", got, err)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			if c.group {
				var r kadm.DeleteGroupResponse
				if r, err = k.adm.DeleteGroup(ctx, group); err == nil {
					err = r.Err
				}
			} else {
				var r kadm.DeleteOffsetsResponses
				if r, err = k.adm.DeleteOffsets(ctx, group, kadm.TopicsSet{topic: {0: {}, 1: {}}}); err == nil {
					err = r.Error()
				}
			}
			if err != nil {
				t.Fatalf("deleting the offsets of %s: %v", group, err)
			}
			eventually(t, 10*time.Second, "the committed offsets gone", func() (bool, string) {
				got, err := k.committed(group, topic)
				return err == nil && len(got) == 0, fmt.Sprintf("committed %v, %v", got, err)
			})
			// More than a cycle of full lag polls (every 50 polls).
			time.Sleep(6 * time.Second)
			if st, err := s.status(); err != nil || st.State != "standby" {
				t.Fatalf("state %q (%v) after the offsets vanished, want standby: no work, no wake", st.State, err)
			}
			if n := s.countLogs("standby: running", "source", "kafka"); n != 0 {
				t.Fatalf("%d wakes with no new record", n)
			}

			k.produceN(topic, 6)
			s.waitAllProcessed(topic, 60*time.Second)
			if n := s.countLogs("standby: running", "source", "kafka"); n != 1 {
				t.Errorf("%d restores woken by Kafka lag, want 1", n)
			}
			s.waitState("standby", 60*time.Second)
			k.produceN(topic, 4)
			s.waitAllProcessed(topic, 60*time.Second)
			if n := s.countLogs("standby: running", "source", "kafka"); n != 2 {
				t.Errorf("%d restores woken by Kafka lag, want 2", n)
			}
			if n := s.countLogs("standby: starting"); n != 1 {
				t.Errorf("%d cold starts, want 1", n)
			}
		})
	}
}
