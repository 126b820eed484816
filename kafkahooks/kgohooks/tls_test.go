package kgohooks

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/internal/testkit/tlstest"
	"github.com/kcr-dev/kcr/notify"
)

// kgo refuses a Dialer beside DialTLSConfig, and the Client dials through
// its own tracker: it must keep kgo's TLS dialing, not fail or drop TLS.
// Produces to a TLS-only kfake broker before and after a resume.
func TestDialTLSThroughTracker(t *testing.T) {
	server, roots := tlstest.SelfSigned(t)
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
