package kgohooks_test

import (
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
)

// In a service, NewClient replaces kgo.NewClient and takes the same
// options; the README shows this code (notify/readme_test.go checks it).
func Example_service() {
	brokers := []string{"127.0.0.1:9092"}
	cl, err := kgohooks.NewClient( // kgo.NewClient's options, unchanged
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("pipeline"),
		kgo.ConsumeTopics("orders"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	// cl.PollFetches, cl.Produce, cl.CommitUncommittedOffsets … as before
}

// A group consumer on KIP-848's protocol (docs/franz-go-kip848.md shows
// this code): kgo's option, unchanged.
func Example_kip848() {
	brokers := []string{"127.0.0.1:9092"}
	cl, err := kgohooks.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("etl"), kgo.ConsumeTopics("orders"),
		kgo.ServerSideBalancer(), // KIP-848: Kafka 4.0+, franz-go recommends 4.3+
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
}
