package standby

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// --share-group: the service sleeps once the share group's backlog is
// empty, a record wakes it (source kafka), it stays up while the backlog
// is not empty though it is idle, and sleeps again when a member accepted
// the record. No group hold runs.
func TestShareGroupWake(t *testing.T) {
	c, addrs := kafkatest.Cluster(t, kfake.SeedTopics(1, "sw"))
	c.SetGroupConfigs("sg", map[string]string{"share.auto.offset.reset": "earliest"})
	kafkatest.Produce(t, addrs, "sw", 2)
	kafkatest.ShareAccept(t, addrs, "sg", "sw", 2)
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.Brokers, o.ShareGroup, o.Topics, o.Poll, o.BrokerTimeout = addrs, "sg", []string{"sw"}, 20*time.Millisecond, 2*time.Second
	})
	if r.s.hold != nil {
		t.Error("a group hold for a share group")
	}
	r.waitState(StateStandby)
	kafkatest.Produce(t, addrs, "sw", 1)
	r.waitState(StateRunning)
	if !strings.Contains(r.log.String(), `"source":"kafka"`) {
		t.Fatalf("not woken by the share backlog:\n%s", r.log.String())
	}
	// Idle for many --idle periods, but a record waits.
	time.Sleep(600 * time.Millisecond)
	if st := r.s.State(); st != StateRunning {
		t.Fatalf("state %s with a record in the share backlog, want running; log:\n%s", st, r.log.String())
	}
	kafkatest.ShareAccept(t, addrs, "sg", "sw", 1)
	r.waitState(StateStandby)
	if _, restores, _ := f.snapshot(); len(restores) != 1 {
		t.Errorf("restores %v, want 1", restores)
	}
}

// --share-group's option rules.
func TestShareGroupOptions(t *testing.T) {
	for _, tc := range []struct {
		mod  func(o *Options)
		want string
	}{
		{func(o *Options) { o.Group = "g" }, "give one"},
		{func(o *Options) { o.Brokers = nil }, "needs --brokers"},
	} {
		o := testOptions(t.TempDir())
		o.Brokers, o.ShareGroup = []string{"127.0.0.1:1"}, "sg"
		tc.mod(&o)
		if err := o.check(); !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want ErrBadOption naming %q", err, tc.want)
		}
	}
	o := testOptions(t.TempDir())
	o.Brokers, o.ShareGroup, o.Topics, o.Kafka = []string{"127.0.0.1:1"}, "sg", []string{"t"}, KafkaSecurity{TLS: true}
	if err := o.check(); err != nil {
		t.Errorf("--share-group with --topics and --kafka-tls: %v", err)
	}
	o.Replicas = true
	if err := o.check(); err != nil {
		t.Errorf("--share-group with --replicas: %v", err)
	}
}
