package e2e

// Consumer-group checkpoint and restore on a broker with Kafka's default
// group settings ($KCR_KAFKA_PROD_BROKERS: group.initial.rebalance.delay.ms
// is 3000 ms there, as in production).

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestKafkaProdGroupRestore checkpoints a kafka-go group consumer (kafkaapp)
// under load and restores it, with and without kafkahooks.WithGroupHandover.
// It asserts what the broker and the records say, not how long it took:
// after the restore the consumer owns every partition again under a member
// id it did not have before (kadm DescribeGroups), no record committed
// before the checkpoint is processed again, and every produced record is
// processed. Without the option the checkpoint's report says the group was
// left empty on a broker that delays its first join (3000 ms); with it the
// old member stays in the group while the process is down.
func TestKafkaProdGroupRestore(t *testing.T) {
	for _, handover := range []bool{false, true} {
		t.Run(fmt.Sprintf("handover=%v", handover), func(t *testing.T) {
			k := needKafkaProd(t)
			topic, group, prod := k.groupTopic("prodgroup", 3, 100)
			args := []string{"-topic", topic, "-group", group, "-consume", "-client-id", "member-a"}
			if handover {
				args = append(args, "-group-handover")
			}
			a := k.startBin(kafkaBin, args...)
			before := k.waitGroup(group, topic, 60*time.Second, "member-a owning the 3 partitions", func(v groupView) bool {
				return v.state == "Stable" && slices.Equal(v.clients, []string{"member-a"}) && len(v.assigned["member-a"]) == 3
			})
			oldID := before.raw[0].MemberID
			a.waitProcessed(0, 20, 30*time.Second)

			img := filepath.Join(t.TempDir(), "img")
			runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
			<-a.done
			rep := manifestResource(t, img, "kafka-reader/"+group)
			t.Logf("reader report in the manifest: %v", rep)
			committed, err := k.committed(group, topic)
			if err != nil {
				t.Fatal(err)
			}
			down, err := k.view(group, topic)
			if err != nil {
				t.Fatal(err)
			}
			if handover {
				if rep["member_kept"] != oldID || rep["left_group"] == true || rep["warning"] != nil {
					t.Errorf("reader report %v: want member_kept=%s, no warning", rep, oldID)
				}
				if len(down.raw) != 1 || down.raw[0].MemberID != oldID {
					t.Errorf("while the consumer is down the group is %v, want the kept member %s", down, oldID)
				}
			} else {
				if rep["left_group"] != true || rep["group_empty"] != true || rep["initial_rebalance_delay_ms"] != float64(3000) || rep["warning"] == nil {
					t.Errorf("reader report %v: want left_group, group_empty, initial_rebalance_delay_ms=3000 and a warning", rep)
				}
				if len(down.raw) != 0 {
					t.Errorf("while the consumer is down the group is %v, want empty", down)
				}
			}
			time.Sleep(time.Second) // down, while records pile up

			na := len(a.events())
			pid, out := restore(t, img)
			inst, _ := out["instance_id"].(string)
			want := "member-a-" + prefix8(inst)
			after := k.waitGroup(group, topic, 60*time.Second, "the restored consumer owning the 3 partitions as "+want, func(v groupView) bool {
				return v.state == "Stable" && slices.Equal(v.clients, []string{want}) && len(v.assigned[want]) == 3
			})
			if newID := after.raw[0].MemberID; newID == oldID {
				t.Errorf("the restored consumer has the member id %s of the checkpointed one", newID)
			}
			a.waitProcessed(na, 20, 30*time.Second)

			prod.finish()
			produced, perrs := prod.snapshot()
			ends := k.endOffsets(topic)
			k.waitCommitted(group, topic, ends, 60*time.Second)
			for x, c := range processed(a.since(na)) {
				if x.o < committed[x.p] {
					t.Errorf("partition %d offset %d (committed before the checkpoint, up to %d) processed %d times after the restore", x.p, x.o, committed[x.p], c)
				}
			}
			t.Logf("%d records produced (%d errors), committed at the checkpoint %v, end offsets %v", len(produced), perrs, committed, ends)
			checkProcessed(t, ends, produced, map[string]*kapp{"member-a": a})
			a.stop(pid)
		})
	}
}
