package kafkastandby

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/tlstest"
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
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c.ListenAddrs(), cl
}

// produce writes n records to topic.
func produce(t *testing.T, addrs []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for range n {
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// secureCluster starts a kfake broker that speaks TLS only and asks for
// SCRAM-SHA-512 (user kcr, password "s3cret"), with topic t, and returns
// its addresses and the CA's PEM file.
func secureCluster(t *testing.T) ([]string, string) {
	t.Helper()
	server, caPEM := tlstest.SelfSignedPEM(t)
	_, addrs := kafkatest.Cluster(t, kfake.TLS(server), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "kcr", "s3cret"),
		kfake.SeedTopics(1, "t"))
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DialTLSConfig(&tls.Config{RootCAs: roots}),
		kgo.SASL(scram.Auth{User: "kcr", Pass: "s3cret"}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()
	return addrs, ca
}

// shareAccept has a member of share group g accept n records of topic t,
// then leave.
func shareAccept(t *testing.T, addrs []string, g, topic string, n int) {
	t.Helper()
	m, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ShareGroup(g), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for got := 0; got < n && t.Context().Err() == nil; {
		m.PollFetches(t.Context()).EachRecord(func(r *kgo.Record) { got++; r.Ack(kgo.AckAccept) })
	}
	if err := m.FlushAcks(t.Context()); err != nil {
		t.Fatal(err)
	}
}
