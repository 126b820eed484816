package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Group offsets gone (kafka-go): a checkpoint makes the group Reader leave, so a
// sole member's group is empty while the image sits on disk, and the
// broker deletes its committed offsets after offsets.retention.minutes.
// The test deletes them with kadm while the service is checkpointed (what
// the expiry does), then restores: the Reader must go on from the offsets
// the image recorded (not from StartOffset, FirstOffset here: everything
// again), commit them again, and report them.
func TestKafkaGroupOffsetsExpired(t *testing.T) {
	k := needKafka(t)
	const parts = 2
	topic, group, prod := k.groupTopic("expire", parts, 50)
	// The check runs for restores a minute after the checkpoint, the
	// smallest retention; here the offsets go at once.
	a := k.start("-topic", topic, "-consume", "-group", group, "-client-id", "expire", "-offsets-check-after", "0s")
	a.waitProcessed(0, 100, 30*time.Second)

	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	<-a.done
	res := "kafka-reader/" + group
	before := manifestResource(t, img, res)
	t.Logf("reader report in the manifest: %v", before)
	if n, _ := before["offsets_recorded"].(float64); int(n) != parts {
		t.Errorf("offsets_recorded %v in the manifest, want %d", before["offsets_recorded"], parts)
	}
	atDump, err := k.committed(group, topic)
	if err != nil || len(atDump) != parts {
		t.Fatalf("committed offsets of %s after the checkpoint: %v, %v; want %d partitions", group, atDump, err, parts)
	}

	// What offsets.retention.minutes does to the empty group.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set := kadm.TopicsSet{}
	for p := range int32(parts) {
		set.Add(topic, p)
	}
	dr, err := k.adm.DeleteOffsets(ctx, group, set)
	if err == nil {
		err = dr.Error()
	}
	if err != nil {
		t.Fatalf("deleting the committed offsets of %s: %v", group, err)
	}
	eventually(t, 10*time.Second, "the committed offsets gone", func() (bool, string) {
		c, err := k.committed(group, topic)
		return err == nil && len(c) == 0, fmt.Sprintf("committed %v, %v", c, err)
	})
	time.Sleep(time.Second) // records produced while the image sits on disk

	n1 := len(a.events())
	pid, out := restore(t, img)
	a.waitAfter(n1, 30*time.Second)
	a.waitProcessed(n1, 100, 30*time.Second)
	after := restoreReport(out, res)
	t.Logf("reader report after the restore: %v", after)
	restored, _ := after["offsets_restored"].([]any)
	if len(restored) != parts {
		t.Errorf("offsets_restored %v, want the %d recorded offsets", after["offsets_restored"], parts)
	}

	// Per partition, the first offset processed after the restore is the
	// one committed at the checkpoint: nothing before it again, no gap.
	first := map[int32]int64{}
	for x := range processed(a.since(n1)) {
		if f, ok := first[x.p]; !ok || x.o < f {
			first[x.p] = x.o
		}
	}
	t.Logf("committed at the checkpoint %v; first offsets processed after the restore %v", atDump, first)
	for p, c := range atDump {
		if f, ok := first[p]; !ok || f != c {
			t.Errorf("partition %d: first offset processed after the restore %d (seen %v), want %d, the offset committed at the checkpoint (FirstOffset would give 0)", p, f, ok, c)
		}
	}
	k.waitCommitted(group, topic, atDump, 30*time.Second)
	prod.finish()
	a.stop(pid)
}
