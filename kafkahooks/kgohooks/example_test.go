package kgohooks_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
)

// A Client is a kgo.Client that survives a checkpoint; here the cycle is
// simulated in-process against kfake, as a service's own tests would.
// kgo's options come first, kgohooks' after them.
func ExampleNew() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "results"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	reg := notify.NewRegistry()
	cl, err := kgohooks.New([]kgo.Opt{
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ClientID("svc"),
		kgo.DefaultProduceTopic("results"),
	}, kgohooks.WithRegistry(reg), kgohooks.WithName("results-producer"))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	ctx := context.Background()
	if err := cl.ProduceSync(ctx, kgo.StringRecord("before")).FirstErr(); err != nil {
		log.Fatal(err)
	}
	res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		log.Fatal(err, res.BeforeErr, res.AfterErr)
	}
	if err := cl.ProduceSync(ctx, kgo.StringRecord("after")).FirstErr(); err != nil {
		log.Fatal(err)
	}
	rep, _ := cl.Report()
	fmt.Println(rep.Phase, rep.Event, "new client:", rep.NewClient)
	fmt.Println("before:", res.Before[0].Details["kept_for_resume"], res.Before[0].Details["connections_open"])
	fmt.Println("new client id:", strings.HasPrefix(cl.ClientID(), "svc-"))
	// Output:
	// after-restore restore new client: true
	// before: true 0
	// new client id: true
}

// A share-group worker: records it does not acknowledge are accepted by its
// next poll; a failed one is released for another member. Before a
// checkpoint the consumer hands back what it holds (docs/share-groups.md).
func ExampleNewShareConsumer() {
	brokers := []string{"127.0.0.1:9092"}
	handle := func(*kgo.Record) error { return nil }
	ctx := context.Background()
	cons, err := kgohooks.NewShareConsumer([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ShareGroup("workers"),
		kgo.ConsumeTopics("jobs"),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cons.Close()
	for {
		fs := cons.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			if err := handle(r); err != nil {
				r.Ack(kgo.AckRelease) // let another member try
			}
			// not acknowledged: accepted by the next poll (kgo's rule)
		})
	}
}
