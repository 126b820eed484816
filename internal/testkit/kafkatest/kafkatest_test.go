package kafkatest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The readers see what was produced, each record once; ReadTo stops at the
// ends it is given; a commit answered by FailCommit fails with its code.
func TestClusterReadersAndCommitFault(t *testing.T) {
	c, addrs := Cluster(t, kfake.SeedTopics(2, "t"), FastGroups())
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for i, v := range []string{"a", "b", "c"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: int32(i % 2), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	values := func(recs []*kgo.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, string(r.Value))
		}
		slices.Sort(out)
		return out
	}
	if got := values(ReadTopic(t, addrs, "t")); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("ReadTopic: %v, want [a b c]", got)
	}
	if got := values(ReadTo(t, 20*time.Second, addrs, "t", map[int32]int64{0: 1})); !slices.Equal(got, []string{"a"}) {
		t.Errorf("ReadTo partition 0 offset 1: %v, want [a]", got)
	}
	got := ReadValues(t, addrs, "t", 3)
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("ReadValues: %v, want [a b c]", got)
	}

	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		return FailCommit(req, kerr.OffsetMetadataTooLarge.Code), nil, true
	})
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "t", Partition: 0, At: 1})
	resp, err := kadm.NewClient(cl).CommitOffsets(ctx, "g", offs)
	if err == nil {
		err = resp.Error()
	}
	if !errors.Is(err, kerr.OffsetMetadataTooLarge) {
		t.Errorf("commit under FailCommit: %v, want OFFSET_METADATA_TOO_LARGE", err)
	}
}
