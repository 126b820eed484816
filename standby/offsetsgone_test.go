package standby

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// offsetsGoneRig is a kfake broker with topic "t" (2 partitions) and group
// "g", which committed 2 records of each partition.
type offsetsGoneRig struct {
	t     *testing.T
	addrs []string
	cl    *kgo.Client
	adm   *kadm.Client
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

func newOffsetsGoneRig(t *testing.T) *offsetsGoneRig {
	addrs, cl := fakeKafka(t)
	g := &offsetsGoneRig{t: t, addrs: addrs, cl: cl, adm: kadm.NewClient(cl)}
	offs := kadm.Offsets{}
	for p := range int32(2) {
		g.produce(p)
		g.produce(p)
		offs.Add(kadm.Offset{Topic: "t", Partition: p, At: 2})
	}
	if _, err := g.adm.CommitOffsets(t.Context(), "g", offs); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *offsetsGoneRig) produce(p int32) {
	g.t.Helper()
	if err := g.cl.ProduceSync(g.t.Context(), &kgo.Record{Topic: "t", Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
		g.t.Fatal(err)
	}
}

// vanish removes the group's offsets the way named: "offsets" deletes them
// (kadm DeleteOffsets), "group" deletes the group (what expiry of an empty
// group's offsets amounts to).
func (g *offsetsGoneRig) vanish(how string) {
	g.t.Helper()
	var err error
	if how == "offsets" {
		var r kadm.DeleteOffsetsResponses
		if r, err = g.adm.DeleteOffsets(g.t.Context(), "g", kadm.TopicsSet{"t": {0: {}, 1: {}}}); err == nil {
			err = r.Error()
		}
	} else {
		var r kadm.DeleteGroupResponse
		if r, err = g.adm.DeleteGroup(g.t.Context(), "g"); err == nil {
			err = r.Err
		}
	}
	if err != nil {
		g.t.Fatalf("delete the %s: %v", how, err)
	}
	fetched, err := g.adm.FetchOffsets(g.t.Context(), "g")
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		g.t.Fatal(err)
	}
	if n := len(fetched.Offsets().Sorted()); n != 0 {
		g.t.Fatalf("%d committed offsets left after deleting the %s", n, how)
	}
}

func (g *offsetsGoneRig) options(topics bool) Options {
	// Poll 0: the default long-polling fetch.
	o := Options{Brokers: g.addrs, Group: "g", BrokerTimeout: 2 * time.Second, Observer: nopObserver{}}
	if topics {
		o.Topics = []string{"t"}
	}
	return o
}

// The supervisor asleep, kcr standby stopped, the group deleted, then kcr
// standby started again: the state file kept where the group was, so the
// new kcr standby does not wake the service for nothing, and wakes it on
// the first new record, topics given or not.
func TestOffsetsGoneAcrossRestart(t *testing.T) {
	for _, topics := range []bool{true, false} {
		t.Run(map[bool]string{true: "topics-given", false: "topics-from-commits"}[topics], func(t *testing.T) {
			g := newOffsetsGoneRig(t)
			withLag := func(o *Options) {
				lo := g.options(topics)
				o.Brokers, o.Group, o.Topics, o.Poll, o.BrokerTimeout = lo.Brokers, lo.Group, lo.Topics, lo.Poll, lo.BrokerTimeout
			}
			dir := filepath.Join(t.TempDir(), "img")
			r := startRig(t, newFake(), dir, withLag)
			r.waitState(StateStandby)
			r.end()
			g.vanish("group")
			f := newFake()
			r2 := startRig(t, f, dir, withLag)
			r2.waitState(StateStandby)
			time.Sleep(300 * time.Millisecond) // the watcher reads the group and waits at the broker
			if starts, restores, _ := f.snapshot(); starts != 0 || len(restores) != 0 {
				t.Fatalf("%d cold starts, restores %v with no new record: want none", starts, restores)
			}
			g.produce(0)
			r2.waitState(StateRunning)
			if starts, restores, _ := f.snapshot(); starts != 0 || len(restores) != 1 {
				t.Fatalf("%d cold starts, restores %v: want the kept image restored", starts, restores)
			}
			if !strings.Contains(r2.log.String(), `"source":"kafka"`) {
				t.Fatalf("not woken by Kafka lag:\n%s", r2.log.String())
			}
		})
	}
}
