package kgohooks

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// producePart writes values to one partition of topic with an independent
// pollFirst produces with produce(0), produce(1), ... and polls c for 300 ms
// after each, until a record comes (the member has joined and resolved its
// start offsets) or ctx ends, and returns the values polled.
func pollFirst(ctx context.Context, c *Client, produce func(i int)) []string {
	var got []string
	for i := 0; len(got) == 0 && ctx.Err() == nil; i++ {
		produce(i)
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		got = kafkatest.PollValues(pctx, c, got, 1)
		cancel()
	}
	return got
}

// kgo client.
func producePart(t *testing.T, addrs []string, topic string, part int32, values []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, v := range values {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte(v), Partition: part}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// Direct partitions with read_committed and AtEnd start at the last
// stable offset, as kgo resolves it, not at the high watermark: the records
// of a transaction open at the checkpoint and committed after the restore
// are delivered.
func TestDirectReadCommittedAtEndIsLSO(t *testing.T) {
	addrs, reg := newRig(t, 1, "rc")
	ctx := testCtx(t, 15*time.Second)
	txn, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("rc"), kgo.TransactionalID("rc-open"))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range vals("t", 5) {
		if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"rc": {0: kgo.NewOffset().AtEnd()}})})
	select {
	case <-c.resolving:
	case <-ctx.Done():
		t.Fatal("start offset not resolved")
	}
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	if next, _ := res.Before[0].Details["next_offsets"].(map[string]int64); next["rc/0"] != 0 {
		t.Errorf("next offsets in the report %v, want rc/0: 0 (the last stable offset)", res.Before[0].Details["next_offsets"])
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if got := kafkatest.PollValues(pctx, c, nil, 5); !slices.Equal(got, vals("t", 5)) {
		t.Errorf("delivered %v, want the committed transaction %v", got, vals("t", 5))
	}
}

// A group member at AtEnd with a partition it never polled from is
// checkpointed; records produced to that partition during the checkpoint
// are delivered after the restore (the partition's start was pinned), and
// nothing is delivered twice.
func TestGroupAtEndUnpolledPartitionKeepsDowntime(t *testing.T) {
	addrs, reg := newRig(t, 2, "ae")
	producePlain(t, addrs, "ae", vals("old", 10), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	reg.Register("probe", notify.Func(func(context.Context) error {
		producePart(t, addrs, "ae", 1, vals("during1", 6))
		producePart(t, addrs, "ae", 0, vals("during0", 3))
		return nil
	}, nil))
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("ae"), kgo.ConsumeTopics("ae"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(100 * time.Millisecond)})
	ctx := testCtx(t, 20*time.Second)
	// Until the member has joined and resolved its start offsets: only
	// partition 0 gets records.
	got := pollFirst(ctx, c, func(i int) {
		producePart(t, addrs, "ae", 0, []string{"p0-" + string(rune('a'+i%26))})
	})
	got = kafkatest.PollMore(ctx, c, got)
	res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	t.Logf("before report: %v", res.Before[0].Details)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var after []string
	after = kafkatest.PollValues(pctx, c, after, 9)
	after = kafkatest.PollMore(ctx, c, after)
	slices.Sort(after)
	want := slices.Concat(vals("during0", 3), vals("during1", 6))
	slices.Sort(want)
	if !slices.Equal(after, want) {
		t.Errorf("after the restore delivered %v, want the 9 records produced during the checkpoint %v", after, want)
	}
}

// A member checkpointed with one partition committed from polled records
// (with their leader epoch) and one pinned at its start: the pin carries the
// leader epoch too, so the restored member validates both before its first
// fetch and a record produced to the committed partition after the restore
// is not held behind a long poll of the pinned one (kgo sends one fetch per
// broker at a time; FetchMaxWait here outlasts the poll's deadline).
func TestPinnedStartCarriesLeaderEpoch(t *testing.T) {
	addrs, reg := newRig(t, 2, "ep")
	producePart(t, addrs, "ep", 0, vals("old", 3))
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("ep"), kgo.ConsumeTopics("ep"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Minute)})
	ctx := testCtx(t, 40*time.Second)
	got := kafkatest.PollValues(ctx, c, nil, 3)
	if !slices.Equal(got, vals("old", 3)) {
		t.Fatalf("before the checkpoint delivered %v, want %v", got, vals("old", 3))
	}
	hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
	fetched, err := kadm.NewClient(mustClient(t, addrs)).FetchOffsets(ctx, "ep")
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[int32]int64{0: 3, 1: 0} {
		o, ok := fetched.Lookup("ep", p)
		if !ok || o.At != want || o.LeaderEpoch < 0 {
			t.Errorf("partition %d committed %+v: want offset %d with the leader's epoch (not -1)", p, o, want)
		}
	}
	producePart(t, addrs, "ep", 0, []string{"new"})
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if after := kafkatest.PollValues(pctx, c, nil, 1); !slices.Equal(after, []string{"new"}) {
		t.Errorf("after the restore delivered %v within 20 s, want [new] (held behind a long poll of the pinned partition?)", after)
	}
}

// The group's committed offsets are gone when the member is restored
// (offsets.retention.minutes expired them while the group was empty; here
// the group is deleted during the checkpoint, which is what expiry does):
// the restored member continues from the offsets the image recorded, not
// from ConsumeResetOffset, and its report says so.
func TestGroupOffsetsGoneAtRestore(t *testing.T) {
	for _, reset := range []string{"start", "end"} {
		t.Run(reset, func(t *testing.T) {
			addrs, reg := newRig(t, 1, "ex")
			group := "ex-" + reset
			producePlain(t, addrs, "ex", vals("old", 10))
			adm := kadm.NewClient(mustClient(t, addrs))
			reg.Register("probe", notify.Func(func(ctx context.Context) error {
				if _, err := adm.DeleteGroup(ctx, group); err != nil {
					t.Errorf("delete group: %v", err)
				}
				producePlain(t, addrs, "ex", vals("during", 5))
				return nil
			}, nil))
			off := kgo.NewOffset().AtStart()
			if reset == "end" {
				off = kgo.NewOffset().AtEnd()
			}
			c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics("ex"),
				kgo.ConsumeResetOffset(off), kgo.FetchMaxWait(100 * time.Millisecond)})
			ctx := testCtx(t, 20*time.Second)
			var got []string
			if reset == "start" {
				got = kafkatest.PollValues(ctx, c, nil, 10)
			} else {
				got = pollFirst(ctx, c, func(int) { producePlain(t, addrs, "ex", []string{"first"}) })
			}
			got = kafkatest.PollMore(ctx, c, got)
			hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			after := kafkatest.PollMore(ctx, c, kafkatest.PollValues(pctx, c, nil, 5))
			if !slices.Equal(after, vals("during", 5)) {
				t.Errorf("after the restore delivered %v, want %v (from the recorded offset)", after, vals("during", 5))
			}
			rep, _ := c.Report()
			if rep.Restore == nil || rep.RecordedOffsetsRestored != 1 {
				t.Errorf("after-restore report %+v: want recorded_offsets_restored 1", rep.Restore)
			}
		})
	}
}

// A transaction open at the checkpoint whose abort fails refuses the
// checkpoint: restored under a new transactional id (SuffixTxnID), nothing
// would end it before transaction.timeout.ms, and read_committed readers
// of its partitions would stall until then.
func TestFailedAbortRefusesCheckpoint(t *testing.T) {
	kf := newKfake(t, 1, "t")
	addrs := kf.ListenAddrs()
	reg := notify.NewRegistry()
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"), kgo.TransactionalID("tx")})
	ctx := testCtx(t, 15*time.Second)
	runTxn(t, ctx, c, "open", 3, false)
	// The transaction coordinator does not answer within the budget (kgo
	// retries a failed abort by re-initializing the producer id: that
	// hangs too).
	release := make(chan struct{})
	defer close(release)
	for _, key := range []kmsg.Key{kmsg.EndTxn, kmsg.InitProducerID} {
		kf.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			kf.SleepControl(func() { <-release })
			return nil, nil, false
		})
	}
	res, err := reg.Simulate(ctx, notify.SimRestore, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before report: %v", res.Before[0].Details)
	if res.BeforeErr == nil || !strings.Contains(res.BeforeErr.Error(), "abort") {
		t.Fatalf("before error %v, want the failed abort", res.BeforeErr)
	}
	if res.Event.Kind != notify.Resume {
		t.Fatalf("event %v, want a resume", res.Event.Kind)
	}
	if id := c.TransactionalID(); id != "tx" {
		t.Errorf("transactional id after the refused checkpoint %q, want tx", id)
	}
}

// A direct consumer of whole topics (ConsumeTopics, no group) continues
// after a restore where the application stopped: with AtStart nothing is
// delivered again, with AtEnd the records produced during the checkpoint
// (also on a partition it never polled from) and after it are delivered.
func TestTopicConsumerAcrossRestore(t *testing.T) {
	for _, reset := range []string{"start", "end"} {
		t.Run(reset, func(t *testing.T) {
			addrs, reg := newRig(t, 2, "tc")
			producePart(t, addrs, "tc", 0, vals("old", 10))
			reg.Register("probe", notify.Func(func(context.Context) error {
				producePart(t, addrs, "tc", 0, vals("during0", 3))
				producePart(t, addrs, "tc", 1, vals("during1", 3))
				return nil
			}, nil))
			off := kgo.NewOffset().AtStart()
			if reset == "end" {
				off = kgo.NewOffset().AtEnd()
			}
			c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("tc"),
				kgo.ConsumeResetOffset(off), kgo.FetchMaxWait(100 * time.Millisecond)})
			ctx := testCtx(t, 20*time.Second)
			var got []string
			if reset == "start" {
				got = kafkatest.PollValues(ctx, c, nil, 10)
			} else {
				got = pollFirst(ctx, c, func(int) { producePart(t, addrs, "tc", 0, []string{"first"}) })
			}
			got = kafkatest.PollMore(ctx, c, got)
			res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 5*time.Second)
			t.Logf("before report: %v", res.Before[0].Details)
			producePart(t, addrs, "tc", 0, vals("after", 5))
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			after := kafkatest.PollMore(ctx, c, kafkatest.PollValues(pctx, c, nil, 11))
			slices.Sort(after)
			want := slices.Concat(vals("during0", 3), vals("during1", 3), vals("after", 5))
			slices.Sort(want)
			if !slices.Equal(after, want) {
				t.Errorf("after the restore delivered %v, want %v", after, want)
			}
		})
	}
}

// Topic consumers, resume. The checkpoint drains what kgo buffered for a topic consumer
// (to learn its positions); a resume with the same kgo client hands those
// records out, in order, none twice.
func TestTopicConsumerResumeAfterDrain(t *testing.T) {
	addrs, reg := newRig(t, 1, "tr")
	producePart(t, addrs, "tr", 0, vals("a", 20))
	c := newHooked(t, reg, []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("tr"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)})
	ctx := testCtx(t, 20*time.Second)
	got := pollUpTo(t, ctx, c, nil, 5)
	time.Sleep(200 * time.Millisecond) // kgo buffers the rest
	hooktest.SimulateOK(t, ctx, reg, notify.SimResume, 5*time.Second)
	producePart(t, addrs, "tr", 0, vals("b", 5))
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got = kafkatest.PollMore(ctx, c, kafkatest.PollValues(pctx, c, got, 25))
	if want := slices.Concat(vals("a", 20), vals("b", 5)); !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}
