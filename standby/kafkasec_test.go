package standby

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// Bad TLS and SASL options of the supervisor's Kafka clients are refused
// before anything starts, each with the flag to fix.
func TestKafkaSecurityOptions(t *testing.T) {
	for _, tc := range []struct {
		k        KafkaSecurity
		noGroup  bool
		wantText string
	}{
		{KafkaSecurity{SASLMechanism: "scram"}, false, "want plain, scram-sha-256, scram-sha-512 or oauthbearer"},
		{KafkaSecurity{SASLMechanism: "SCRAM-SHA-512", SASLPassword: "p"}, false, "needs --kafka-sasl-user"},
		{KafkaSecurity{SASLMechanism: "plain", SASLUser: "u"}, false, "needs the password"},
		{KafkaSecurity{SASLMechanism: "plain", SASLUser: "u", SASLPassword: "p", SASLPasswordFile: "f"}, false, "not both"},
		{KafkaSecurity{SASLMechanism: "scram-sha-256", SASLUser: "u", SASLPassword: "p", SASLTokenFile: "f"}, false, "is for oauthbearer"},
		{KafkaSecurity{SASLMechanism: "oauthbearer"}, false, "needs --kafka-sasl-token-file"},
		{KafkaSecurity{SASLMechanism: "oauthbearer", SASLTokenFile: "f", SASLUser: "u"}, false, "drop the SASL user and password"},
		{KafkaSecurity{SASLUser: "u"}, false, "without --kafka-sasl-mechanism"},
		{KafkaSecurity{TLSCert: "c"}, false, "go together"},
		{KafkaSecurity{TLS: true}, true, "need --group"},
	} {
		o := testOptions(t.TempDir())
		o.Brokers, o.Group, o.Kafka = []string{"127.0.0.1:1"}, "g", tc.k
		if tc.noGroup {
			o.Group = ""
		}
		err := o.check()
		if !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), tc.wantText) {
			t.Errorf("%+v: %v, want ErrBadOption naming %q", tc.k, err, tc.wantText)
		}
	}
}

// The Kafka wake and the group hold reach a broker that speaks TLS and
// SCRAM only, with the CA and password files: the service sleeps and a
// record wakes it. Without the options, or with a wrong password, kcr
// standby does not start.
func TestKafkaWakeOverTLSAndSCRAM(t *testing.T) {
	addrs, cl, ca := kafkatest.SecureCluster(t)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secure := KafkaSecurity{TLSCA: ca, SASLMechanism: "SCRAM-SHA-512", SASLUser: "kcr", SASLPasswordFile: pwFile}
	withLag := func(k KafkaSecurity) func(*Options) {
		return func(o *Options) {
			o.Brokers, o.Group, o.Topics, o.Poll, o.BrokerTimeout, o.Kafka = addrs, "g", []string{"t"}, 20*time.Millisecond, 2*time.Second, k
		}
	}
	for _, k := range []KafkaSecurity{{}, {TLSCA: ca}, {TLSCA: ca, SASLMechanism: "scram-sha-512", SASLUser: "kcr", SASLPassword: "wrong"}} {
		o := testOptions(filepath.Join(t.TempDir(), "img"))
		withLag(k)(&o)
		o.BrokerTimeout = time.Second
		if s, err := newSupervisor(t.Context(), o, newFake()); err == nil {
			s.close()
			t.Errorf("kcr standby started with Kafka options %+v: want no broker answering", k)
		}
	}
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), withLag(secure))
	r.waitState(StateStandby)
	if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: "t", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r.waitState(StateRunning)
	if !strings.Contains(r.log.String(), `"source":"kafka"`) {
		t.Fatalf("not woken by Kafka lag:\n%s", r.log.String())
	}
}
