package kafkastandby

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

type nopObserver struct{}

func (nopObserver) BrokerRequests(int) {}
func (nopObserver) GroupHold(string)   {}

// testConfig is a Config as kcr standby gives it, with standby's defaults,
// for brokers addrs.
func testConfig(t *testing.T, addrs []string) Config {
	return Config{Brokers: addrs, BrokerTimeout: 5 * time.Second, ReplicasTopic: "kcr-standby-replicas", MinWake: 1,
		ScaleUpAfter: 10 * time.Second, ImageDir: t.TempDir(), Version: "test",
		Logger: slog.New(slog.DiscardHandler), Observer: nopObserver{}, SaveHold: func(string, string) error { return nil }}
}

// fakeKafka starts a one-broker kfake cluster with topic "t" (2
// partitions) and a client that writes to the partition a record names.
func fakeKafka(t *testing.T) ([]string, *kgo.Client) {
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(2, "t"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return addrs, cl
}
