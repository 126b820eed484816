package kafkahooks

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/notify"
)

// Tests on a real broker with Kafka's default group settings
// (group.initial.rebalance.delay.ms=3000): $KCR_KAFKA_PROD_BROKERS, which
// scripts/test.sh sets (scripts/kafka-up.sh with KCR_KAFKA_PROD=1). With
// KCR_E2E=1 they fail when it is not set; elsewhere they skip.

func prodBrokers(t testing.TB) []string {
	t.Helper()
	env := os.Getenv("KCR_KAFKA_PROD_BROKERS")
	if env == "" {
		const why = "KCR_KAFKA_PROD_BROKERS is not set (KCR_KAFKA_PROD=1 scripts/kafka-up.sh starts such a broker; scripts/test.sh sets it)"
		if os.Getenv("KCR_E2E") == "1" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	return strings.Split(env, ",")
}

// prodTopic creates a topic of parts partitions on the broker, with values
// 0..n-1, and returns its name and an admin client.
func prodTopic(t testing.TB, addrs []string, parts int32, n int) (string, *kadm.Client) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	topic := fmt.Sprintf("kcr-kh-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := adm.CreateTopic(ctx, parts, 1, nil, topic); err != nil || res.Err != nil {
		t.Fatalf("create topic %s: %v %v", topic, err, res.Err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		adm.DeleteTopics(ctx, topic)
	})
	// Every partition has a leader, in the metadata of every client,
	// before anything reads or writes (a group reader joining earlier
	// would get no partitions).
	waitFor(t, 30*time.Second, "the partitions of "+topic+" to have leaders", func() bool {
		offs, err := adm.ListEndOffsets(ctx, topic)
		ok := 0
		if err == nil {
			offs.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					ok++
				}
			})
		}
		m, err := adm.Metadata(ctx, topic)
		return ok == int(parts) && err == nil && len(m.Topics[topic].Partitions) == int(parts) && m.Topics[topic].Err == nil
	})
	log, _ := newLog(t)
	writeBatch(t, addrs, topic, log, n)
	return topic, adm
}

// groupMembers returns the group's state and, per member id, the
// partitions of topic assigned to it, as the broker describes them.
func groupMembers(t *testing.T, adm *kadm.Client, group, topic string) (string, map[string][]int32) {
	t.Helper()
	state, members, err := tryGroupMembers(adm, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	return state, members
}

func tryGroupMembers(adm *kadm.Client, group, topic string) (string, map[string][]int32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return "", nil, err
	}
	g := gs[group]
	if g.Err != nil {
		return "", nil, g.Err
	}
	out := map[string][]int32{}
	for _, m := range g.Members {
		a, _ := m.Assigned.AsConsumer()
		var ps []int32
		if a != nil {
			for _, tp := range a.Topics {
				if tp.Topic == topic {
					ps = append(ps, tp.Partitions...)
				}
			}
		}
		slices.Sort(ps)
		out[m.MemberID] = ps
	}
	return g.State, out, nil
}

// TestReaderProdCheckpointRestore checkpoints and restores (in-process) a
// group reader on the production-defaults broker, with and without
// WithGroupHandover. Both ways the restored reader owns every partition
// again under a member id it did not have before, and no record committed
// before the checkpoint is fetched again. Without the option the checkpoint
// report warns that the group was left empty on a broker that delays its
// first join; with it the old member stays through the checkpoint and is
// removed once the new one has joined.
func TestReaderProdCheckpointRestore(t *testing.T) {
	addrs := prodBrokers(t)
	for _, handover := range []bool{false, true} {
		t.Run(fmt.Sprintf("handover=%v", handover), func(t *testing.T) {
			const parts, n, before = 3, 60, 30
			topic, adm := prodTopic(t, addrs, parts, n)
			group := topic + "-g"
			reg := notify.NewRegistry()
			// Registered first: its before hook runs after the reader's, its
			// after hook before the reader's; the process is "down" between.
			var membersDown map[string][]int32
			hook(reg, func(context.Context) error {
				_, membersDown = groupMembers(t, adm, group, topic)
				time.Sleep(500 * time.Millisecond)
				return nil
			}, nil)
			log, _ := newLog(t)
			opts := []ReaderOpt{WithRegistry(reg), WithLogger(log)}
			if handover {
				opts = append(opts, WithGroupHandover())
			}
			r := NewReader(kafka.ReaderConfig{Brokers: addrs, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
				MaxWait: 100 * time.Millisecond, SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second,
				RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 100 * time.Millisecond}, opts...)
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			seen := map[string]int{}
			for range before {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				seen[string(m.Value)]++
				if err := r.CommitMessages(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			_, membersBefore := groupMembers(t, adm, group, topic)
			if len(membersBefore) != 1 {
				t.Fatalf("before the checkpoint the group has members %v, want one", membersBefore)
			}
			var oldID string
			for id := range membersBefore {
				oldID = id
			}

			res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 10*time.Second)
			restored := time.Now()
			var rep ReaderReport
			for _, b := range res.Before {
				if strings.HasPrefix(b.Name, "kafka-reader/") {
					rep = decodeReport[ReaderReport](t, b.Details)
				}
			}
			if rep.ReaderCheckpoint == nil || rep.GroupCheckpoint == nil {
				t.Fatalf("no group checkpoint report: %+v", res.Before)
			}
			gc := rep.GroupCheckpoint
			if handover {
				if gc.LeftGroup || gc.MemberKept != oldID || gc.GroupEmpty || gc.Warning != "" {
					t.Errorf("report %+v: want the member %s kept, no warning", gc, oldID)
				}
				if _, ok := membersDown[oldID]; !ok || len(membersDown) != 1 {
					t.Errorf("while down the group has %v, want the old member %s", membersDown, oldID)
				}
			} else {
				if !gc.LeftGroup || !gc.GroupEmpty || gc.InitialRebalanceDelayMS != 3000 || !strings.Contains(gc.Warning, "group.initial.rebalance.delay.ms=3000") {
					t.Errorf("report %+v: want the empty group and the 3000 ms delay warned about", gc)
				}
				if len(membersDown) != 0 {
					t.Errorf("while down the group has %v, want none", membersDown)
				}
			}

			first := true
			for len(seen) < n {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					t.Fatalf("after the restore, with %d of %d records: %v", len(seen), n, err)
				}
				if first {
					t.Logf("restore to first record: %v", time.Since(restored))
					first = false
				}
				if seen[string(m.Value)] > 0 {
					t.Errorf("record %s (partition %d offset %d) was committed before the checkpoint and delivered again", m.Value, m.Partition, m.Offset)
				}
				seen[string(m.Value)]++
				if err := r.CommitMessages(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				if seen[strconv.Itoa(i)] != 1 {
					t.Errorf("record %d delivered %d times", i, seen[strconv.Itoa(i)])
				}
			}
			if handover {
				waitFor(t, 10*time.Second, "the hand-over to finish", func() bool { _, ok := r.Handover(); return ok })
				if h, _ := r.Handover(); h.Result != HandoverDone || !slices.Equal(h.Old, []string{oldID}) {
					t.Errorf("hand-over %+v, want %s removed after the new member joined", h, oldID)
				}
			}
			state, members := groupMembers(t, adm, group, topic)
			if len(members) != 1 {
				t.Fatalf("after the restore the group (%s) has members %v, want one", state, members)
			}
			for id, ps := range members {
				if id == oldID {
					t.Errorf("the restored reader has the old member id %s", id)
				}
				if !slices.Equal(ps, []int32{0, 1, 2}) {
					t.Errorf("member %s owns partitions %v, want [0 1 2]", id, ps)
				}
			}
		})
	}
}

// TestReaderProdNoWarningWithOtherMember: a checkpoint that leaves another
// member in the group does not warn about the initial rebalance delay (the
// group is not empty, and the restored member joins without it).
func TestReaderProdNoWarningWithOtherMember(t *testing.T) {
	addrs := prodBrokers(t)
	const parts, n = 4, 40
	topic, adm := prodTopic(t, addrs, parts, n)
	group := topic + "-g"
	log, _ := newLog(t)
	cfg := kafka.ReaderConfig{Brokers: addrs, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		MaxWait: 100 * time.Millisecond, SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second,
		RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 100 * time.Millisecond}
	regA := notify.NewRegistry()
	a := NewReader(cfg, WithRegistry(regA), WithLogger(log), WithClientID("member-a"))
	defer a.Close()
	b := NewReader(cfg, WithRegistry(notify.NewRegistry()), WithLogger(log), WithClientID("member-b"))
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Both fetch (so both joined); wait until the broker lists two members.
	consumeCommitting(ctx, a, b)
	waitFor(t, 30*time.Second, "two members in the group", func() bool {
		state, members, err := tryGroupMembers(adm, group, topic)
		return err == nil && state == "Stable" && len(members) == 2
	})
	res := hooktest.SimulateOK(t, context.Background(), regA, notify.SimRestore, 10*time.Second)
	rep := decodeReport[ReaderReport](t, res.Before[0].Details)
	if rep.GroupCheckpoint == nil || !rep.LeftGroup || rep.GroupEmpty || rep.Warning != "" || rep.DiagnoseError != "" {
		t.Errorf("report %+v: want the group left, not empty, no warning", rep.GroupCheckpoint)
	}
}
