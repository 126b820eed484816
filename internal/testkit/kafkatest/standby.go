package kafkatest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kcr-dev/kcr/internal/testkit/tlstest"
)

// Produce writes n records ("x") to topic, with a client of its own.
func Produce(t testing.TB, addrs []string, topic string, n int) {
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

// ShareAccept has a member of share group g accept n records of topic,
// then leave.
func ShareAccept(t testing.TB, addrs []string, g, topic string, n int) {
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

// SecureCluster starts a kfake broker that speaks TLS only and asks for
// SCRAM-SHA-512 (user kcr, password "s3cret"), with topic t, and returns
// its addresses, a client of its own, and the CA's PEM file.
func SecureCluster(t testing.TB) ([]string, *kgo.Client, string) {
	t.Helper()
	server, caPEM := tlstest.SelfSignedPEM(t)
	_, addrs := Cluster(t, kfake.TLS(server), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "kcr", "s3cret"),
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
	t.Cleanup(cl.Close)
	return addrs, cl, ca
}
