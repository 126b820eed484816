package kafkahooks_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kcr-dev/kcr/kafkahooks"
	"github.com/kcr-dev/kcr/notify"
)

// A Writer is a kafka.Writer that survives a checkpoint; here the cycle is
// simulated in-process against kfake, as a service's own tests would.
func ExampleNewWriter() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "results"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	reg := notify.NewRegistry()
	w := kafkahooks.NewWriter(&kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        "results",
		RequiredAcks: kafka.RequireAll,
	}, kafkahooks.WithRegistry(reg), kafkahooks.WithClientID("svc"))
	defer w.Close()

	ctx := context.Background()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("before")}); err != nil {
		log.Fatal(err)
	}
	res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		log.Fatal(err, res.BeforeErr, res.AfterErr)
	}
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("after")}); err != nil {
		log.Fatal(err)
	}
	rep, _ := w.Report()
	fmt.Println(rep.Phase, rep.Event, "gate open:", rep.GateOpen, "carried:", rep.RecordsCarried)
	fmt.Println("new client id:", strings.HasPrefix(w.ClientID(), "svc-"), w.ClientID() != "svc")
	// Output:
	// after-restore restore gate open: true carried: 0
	// new client id: true true
}

// A partition Reader continues after a checkpoint at exactly the next
// record the application would have received.
func ExampleNewReader() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	prod := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "orders", RequiredAcks: kafka.RequireAll}
	for _, v := range []string{"a", "b", "c"} {
		if err := prod.WriteMessages(ctx, kafka.Message{Value: []byte(v)}); err != nil {
			log.Fatal(err)
		}
	}
	prod.Close()

	reg := notify.NewRegistry()
	r := kafkahooks.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: "orders", MaxWait: 100 * time.Millisecond},
		kafkahooks.WithRegistry(reg))
	defer r.Close()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("before:", m.Offset, string(m.Value))
	if res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second); err != nil || res.BeforeErr != nil {
		log.Fatal(err, res.BeforeErr)
	}
	m, err = r.FetchMessage(ctx)
	if err != nil {
		log.Fatal(err)
	}
	rep, _ := r.Report()
	fmt.Println("after:", m.Offset, string(m.Value), "reported next offset:", *rep.NextOffset)
	// Output:
	// before: 0 a
	// after: 1 b reported next offset: 1
}

// The README's snippet: wrapping a service's kafka-go clients is all it
// needs to take part in checkpoints (needs a broker, so it does not run).
func Example() {
	brokers := []string{"127.0.0.1:9092"}
	w := kafkahooks.NewWriter(&kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        "results",
		RequiredAcks: kafka.RequireAll, // kafka-go's default (none) acknowledges a write once it is on a socket
	})
	r := kafkahooks.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "pipeline", Topic: "orders"})
	// w.WriteMessages, r.FetchMessage, r.CommitMessages, Stats, Close … as before
	defer w.Close()
	defer r.Close()
}

// A group Reader that keeps its membership across a short checkpoint, so
// that its restore does not wait for the broker's initial rebalance delay
// (docs/kafka-go-restore-time.md; needs a broker, so it does not run).
func ExampleWithGroupHandover() {
	brokers := []string{"127.0.0.1:9092"}
	r := kafkahooks.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "g", Topic: "orders",
		SessionTimeout: 30 * time.Second /* the window, see below */},
		kafkahooks.WithGroupHandover())
	defer r.Close()
}
