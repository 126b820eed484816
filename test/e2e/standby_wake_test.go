package e2e

// kcr standby's Kafka wake on the real broker: transactional upstreams, a
// topic created again while the service sleeps, an exactly-once pipeline.

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// txnProduce produces n records to topic, spread over its partitions, in
// one transaction that is committed or aborted.
func (k *kafkaEnv) txnProduce(topic string, n int, commit bool) {
	k.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-txn-producer"),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
		kgo.TransactionalID(uniqueName("upstream")))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		k.t.Fatal(err)
	}
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Value: []byte(strconv.Itoa(i))}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		k.t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		k.t.Fatal(err)
	}
}

// readCommittedRecords reads topic read_committed, with a client of its own,
// until want records came (within 60 s), then for one more second (a
// duplicate shows), and returns them.
func (k *kafkaEnv) readCommittedRecords(topic string, want int) []*kgo.Record {
	k.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-reader"),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(60 * time.Second)
	var more time.Time
	for {
		now := time.Now()
		if len(recs) >= want && more.IsZero() {
			more = now.Add(time.Second)
		}
		if (!more.IsZero() && now.After(more)) || now.After(deadline) {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		cancel()
	}
	if len(recs) < want {
		k.t.Fatalf("read %d committed records of %s within 60 s, want %d", len(recs), topic, want)
	}
	return recs
}

// A consumer fed by a transactional producer is woken by a committed
// transaction and sleeps again though its commits stay below the end
// offsets (each transaction's marker is past them); an aborted transaction
// does not wake it, the next committed one does: every committed record
// processed once, no aborted one.
func TestStandbyTransactionalUpstream(t *testing.T) {
	k := needKafka(t)
	topic, group := k.newTopic("standby-txn", 2), uniqueName("standby-txn")
	flags := []string{"--idle", "1s", "--group", group, "--topics", topic}
	s := k.startStandby(filepath.Join(t.TempDir(), "img"), flags,
		append(consumerArgs(kgoBin, k.brokers, topic, group), "-read-committed")...)
	s.waitState("standby", 60*time.Second)
	k.txnProduce(topic, 3, true)
	waitProcessedCommitted(s, topic, 3)
	s.waitState("standby", 60*time.Second)

	k.txnProduce(topic, 4, false)
	time.Sleep(3 * time.Second) // many fetches: the aborted batches and their markers are there
	if st, _ := s.status(); st.State != "standby" {
		t.Fatalf("state %q after an aborted transaction, want standby", st.State)
	}
	k.txnProduce(topic, 5, true)
	waitProcessedCommitted(s, topic, 8)
	s.waitState("standby", 60*time.Second)
	if n := s.countLogs("standby: running", "source", "kafka"); n != 2 {
		t.Errorf("%d restores woken by Kafka, want 2", n)
	}
}

// waitProcessedCommitted waits until the service processed the want
// committed records of topic, each once, and none other (no aborted one).
func waitProcessedCommitted(s *sbRun, topic string, want int) {
	s.t.Helper()
	recs := s.k.readCommittedRecords(topic, want)
	committed := map[po]bool{}
	for _, r := range recs {
		committed[po{r.Partition, r.Offset}] = true
	}
	eventually(s.t, 60*time.Second, fmt.Sprintf("%d committed records of %s processed", want, topic), func() (bool, string) {
		got := processed(s.svcEvents())
		n := 0
		for k := range committed {
			if got[k] > 0 {
				n++
			}
		}
		return n == len(committed), fmt.Sprintf("%d of %d", n, len(committed))
	})
	for k, n := range processed(s.svcEvents()) {
		if !committed[k] {
			s.t.Errorf("partition %d offset %d processed, not a committed record", k.p, k.o)
		} else if n > 1 {
			s.t.Errorf("partition %d offset %d processed %d times", k.p, k.o, n)
		}
	}
}

// A topic deleted and created again while the service sleeps is new work:
// its first record wakes the service, though its end offsets are below
// those the group had committed.
func TestStandbyTopicCreatedAgain(t *testing.T) {
	k := needKafka(t)
	topic, group := k.newTopic("standby-recreate", 2), uniqueName("standby-recreate")
	flags := []string{"--idle", "1s", "--group", group, "--topics", topic}
	s := k.startStandby(filepath.Join(t.TempDir(), "img"), flags, consumerArgs(kgoBin, k.brokers, topic, group)...)
	k.produceN(topic, 6)
	s.waitAllProcessed(topic, 60*time.Second)
	s.waitState("standby", 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := k.adm.DeleteTopics(ctx, topic); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "topic "+topic+" created again", func() (bool, string) {
		res, err := k.adm.CreateTopic(ctx, 2, 1, nil, topic)
		if err == nil {
			err = res.Err
		}
		return err == nil, fmt.Sprint(err)
	})
	eventually(t, 30*time.Second, "topic "+topic+" has leaders", func() (bool, string) {
		ends, err := k.adm.ListEndOffsets(ctx, topic)
		return err == nil && ends.Error() == nil, fmt.Sprint(err)
	})
	k.produceN(topic, 2)
	eventually(t, 60*time.Second, "the service woken by Kafka", func() (bool, string) {
		return s.countLogs("standby: running", "source", "kafka") == 1, ""
	})
}

// An exactly-once pipeline (kgoapp -transform-from: read_committed, a
// transactional producer, the input's offsets committed in the
// transaction) fed by a transactional upstream sleeps and wakes 10 times
// under kcr standby; the output, read by a reader of its own, has every
// committed input record once, and no aborted one.
func TestStandbyExactlyOncePipeline(t *testing.T) {
	k := needKafka(t)
	in, out := k.newTopic("standby-eos-in", 2), k.newTopic("standby-eos-out", 2)
	group := uniqueName("standby-eos")
	flags := []string{"--idle", "1s", "--group", group, "--topics", in}
	s := k.startStandby(filepath.Join(t.TempDir(), "img"), flags, kgoBin, "-brokers", k.brokers, "-transform-from", in,
		"-topic", out, "-group", group, "-txn-id", uniqueName("eos"), "-client-id", "eos", "-read-committed")
	const cycles, per = 10, 20
	for cycle := 1; cycle <= cycles; cycle++ {
		s.waitState("standby", 60*time.Second)
		k.txnProduce(in, 5, false)
		k.txnProduce(in, per, true)
		eventually(t, 60*time.Second, fmt.Sprintf("cycle %d: %d records copied", cycle, cycle*per), func() (bool, string) {
			n := 0
			for _, e := range s.svcEvents() {
				if e["ev"] == "txn" && e["committed"] == true {
					n += int(num(e["records"]))
				}
			}
			return n >= cycle*per, fmt.Sprintf("%d", n)
		})
	}
	s.waitState("standby", 60*time.Second)
	inputs := map[string]bool{}
	for _, r := range k.readCommittedRecords(in, cycles*per) {
		inputs[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
	}
	seen := k.readCommitted(out, inputs)
	for src, n := range seen {
		switch {
		case !inputs[src]:
			t.Errorf("output record from %s, not a committed input record", src)
		case n > 1:
			t.Errorf("input %s copied %d times", src, n)
		}
	}
	for src := range inputs {
		if seen[src] == 0 {
			t.Errorf("input %s never copied", src)
		}
	}
	if n := s.countLogs("standby: running", "source", "kafka"); n != cycles {
		t.Errorf("%d restores woken by Kafka, want %d", n, cycles)
	}
	if n := s.countLogs("standby: starting"); n != 1 {
		t.Errorf("%d cold starts, want 1", n)
	}
}
