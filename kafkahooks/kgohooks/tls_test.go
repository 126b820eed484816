package kgohooks

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// kgo refuses a Dialer beside DialTLSConfig, and the Client dials through
// its own tracker: it must keep kgo's TLS dialing, not fail or drop TLS.
// Produces to a TLS-only kfake broker before and after a resume.
func TestDialTLSThroughTracker(t *testing.T) {
	server, roots := selfSigned(t)
	_, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "t"), kfake.TLS(server))
	reg := notify.NewRegistry()
	c, err := New([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"),
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots})}, WithRegistry(reg))
	if err != nil {
		t.Fatalf("New with kgo.DialTLSConfig: %v", err)
	}
	defer c.Close()
	ctx := testCtx(t, 15*time.Second)
	if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte("a")}).FirstErr(); err != nil {
		t.Fatalf("produce over TLS: %v", err)
	}
	hooktest.SimulateOK(t, ctx, reg, notify.SimResume, 5*time.Second)
	if err := c.ProduceSync(ctx, &kgo.Record{Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatalf("produce over TLS after the resume: %v", err)
	}
}

// selfSigned returns a server TLS config for 127.0.0.1 and the pool that
// trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, roots
}
