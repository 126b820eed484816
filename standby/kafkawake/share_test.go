package kafkawake

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// A share group's backlog: 10 records, 4 accepted by a member, 6 left; an
// uninitialized group has none.
func TestShareBacklog(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "st"))
	c.SetGroupConfigs("sg", map[string]string{"share.auto.offset.reset": "earliest"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("st"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if b, err := ShareBacklog(ctx, cl, "sg"); err != nil || len(b) != 0 {
		t.Fatalf("before any member: backlog %v, %v; want none", b, err)
	}
	for i := range 10 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte{byte(i)}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ShareGroup("sg"), kgo.ConsumeTopics("st"),
		kgo.ShareMaxRecords(4), kgo.ShareMaxRecordsStrict())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got int
	for got == 0 && ctx.Err() == nil {
		m.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got++; r.Ack(kgo.AckAccept) })
	}
	if err := m.FlushAcks(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := ShareBacklog(ctx, cl, "sg")
	if err != nil {
		t.Fatal(err)
	}
	if b["st"][0] != int64(10-got) {
		t.Fatalf("backlog %v after %d of 10 accepted: want %d on st/0", b, got, 10-got)
	}
}
