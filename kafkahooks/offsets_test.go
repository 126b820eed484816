package kafkahooks

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
	"github.com/kcr-dev/kcr/notify"
)

// committedAt returns the group's committed offset of topic/partition, -1
// if none.
func committedAt(t *testing.T, adm *kadm.Client, group, topic string, partition int32) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	os, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetching the offsets of %s: %v", group, err)
	}
	if o, ok := os.Lookup(topic, partition); ok && o.Err == nil {
		return o.At
	}
	return -1
}

// TestGroupOffsetsExpiredRestored: the group's committed offsets are
// deleted while the service is checkpointed, as offsets.retention.minutes
// does to a group left empty. After the restore the Reader must go on from
// the position the image recorded, not from StartOffset, and report it.
func TestGroupOffsetsExpiredRestored(t *testing.T) {
	for _, start := range []struct {
		name   string
		offset int64
	}{{"first", kafka.FirstOffset}, {"last", kafka.LastOffset}} {
		t.Run(start.name, func(t *testing.T) {
			const topic, group = "exp", "expg"
			k, adm, reg, log, sink := groupRig(t, 1, topic, 30)
			var deleted atomic.Bool
			hook(reg, func(ctx context.Context) error {
				// Runs after the Reader's hook: the group is empty.
				_, err := adm.DeleteOffsets(ctx, group, kadm.TopicsSet{topic: {0: {}}})
				deleted.Store(err == nil)
				return err
			}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if start.offset == kafka.LastOffset {
				// Commit 20 by hand: a LastOffset reader starts at the end.
				if _, err := adm.CommitOffsets(ctx, group, offsetsAt(topic, 0, 20)); err != nil {
					t.Fatal(err)
				}
			}
			c := groupConfig(k.addrs, group, topic, "exp")
			c.StartOffset = start.offset
			r := NewReader(c, WithRegistry(reg), WithLogger(log), WithOffsetsCheckAfter(0))
			defer r.Close()
			if start.offset == kafka.LastOffset {
				m, err := r.FetchMessage(ctx)
				if err != nil || m.Offset != 20 {
					t.Fatalf("first fetch: %d, %v", m.Offset, err)
				}
				if err := r.CommitMessages(ctx, m); err != nil {
					t.Fatal(err)
				}
			} else {
				fetchCommitInOrder(t, ctx, r, 21)
			}
			res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
			if !deleted.Load() {
				t.Fatal("the group's offsets were not deleted during the checkpoint")
			}
			writeBatch(t, k.addrs, topic, log, 5) // offsets 30..34, during the downtime
			m, err := r.FetchMessage(ctx)
			if err != nil || m.Offset != 21 {
				t.Fatalf("first fetch after the restore: offset %d, %v; want 21, the position recorded in the image (before report %v, after %v)",
					m.Offset, err, res.Before[len(res.Before)-1].Details, res.After[len(res.After)-1].Details)
			}
			after := decodeReport[ReaderReport](t, res.After[len(res.After)-1].Details)
			t.Logf("after-restore hook took %d ms", after.DurationMS)
			if after.GroupRestore == nil || len(after.GroupRestore.OffsetsRestored) != 1 || after.GroupRestore.OffsetsRestored[0].Offset != 21 {
				t.Fatalf("after-restore report %+v: want the restored offset 21 of %s/0", after.GroupRestore, topic)
			}
			if !sink.has(slog.LevelWarn, "committed offsets") {
				t.Error("no warning logged for the restored offsets")
			}
		})
	}
}

// TestGroupOffsetsCheckAfter: by default the check runs only for a restore
// that comes a minute or more after the checkpoint (offsets cannot expire
// sooner): a quick restore leaves the broker's offsets as they are, here
// deleted by hand, and costs no round trip.
func TestGroupOffsetsCheckAfter(t *testing.T) {
	const topic, group = "expq", "expqg"
	k, adm, reg, log, _ := groupRig(t, 1, topic, 30)
	hook(reg, func(ctx context.Context) error {
		_, err := adm.DeleteOffsets(ctx, group, kadm.TopicsSet{topic: {0: {}}})
		return err
	}, nil)
	r := NewReader(groupConfig(k.addrs, group, topic, "expq"), WithRegistry(reg), WithLogger(log))
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	fetchCommitInOrder(t, ctx, r, 21)
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	before := decodeReport[ReaderReport](t, res.Before[0].Details)
	if before.GroupCheckpoint == nil || before.OffsetsRecorded != 1 {
		t.Fatalf("before report %+v: want 1 offset recorded", before.GroupCheckpoint)
	}
	after := decodeReport[ReaderReport](t, res.After[len(res.After)-1].Details)
	if after.GroupRestore != nil {
		t.Fatalf("after-restore report %+v: a restore within a minute checked the offsets", after.GroupRestore)
	}
	m, err := r.FetchMessage(ctx)
	if err != nil || m.Offset != 0 {
		t.Fatalf("first fetch after the restore: %d, %v; want 0 (StartOffset: the deleted offsets are left alone)", m.Offset, err)
	}
}

// offsetsAt is a kadm.Offsets committing at for topic/partition.
func offsetsAt(topic string, partition int32, at int64) kadm.Offsets {
	os := kadm.Offsets{}
	os.Add(kadm.Offset{Topic: topic, Partition: partition, At: at, LeaderEpoch: -1})
	return os
}

// TestUnflushedCommitsNotMovedBack: with WithUnflushedCommits, commits that
// could not be flushed before the checkpoint stay in the image. After the
// restore they must pass the handed-records check like any commit of a
// record fetched before the checkpoint: a copy that has not been handed
// that partition from at most that offset must not send them, so that the
// offset that another member advanced during the downtime is never moved
// back.
func TestUnflushedCommitsNotMovedBack(t *testing.T) {
	const topic, group = "unf", "unfg"
	k, adm, reg, log, _ := groupRig(t, 1, topic, 40)
	var failCommits atomic.Bool
	k.c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.c.KeepControl()
		if !failCommits.Load() {
			return nil, nil, false
		}
		return kafkatest.FailCommit(req, kerr.CoordinatorNotAvailable.Code), nil, true
	})
	hook(reg, nil, func(ctx context.Context, ev notify.Event) error {
		// During the downtime another member took the partition over and
		// committed up to 30. (The Reader spent its budget on the flush,
		// so it did not leave the group: wait for its session to expire.)
		failCommits.Store(false)
		for {
			gs, err := adm.DescribeGroups(ctx, group)
			if err == nil && gs[group].State == "Empty" {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		resp, err := adm.CommitOffsets(ctx, group, offsetsAt(topic, 0, 30))
		if err == nil {
			err = resp.Error()
		}
		return err
	})
	c := groupConfig(k.addrs, group, topic, "unf")
	c.CommitInterval = 50 * time.Millisecond
	c.SessionTimeout = 500 * time.Millisecond
	r := NewReader(c, WithRegistry(reg), WithLogger(log), WithUnflushedCommits())
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	fetchCommitInOrder(t, ctx, r, 10)
	waitFor(t, 5*time.Second, "the interval commit of offset 10", func() bool { return committedAt(t, adm, group, topic, 0) == 10 })
	failCommits.Store(true)
	for i := 10; i < 20; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	res, err := reg.Simulate(context.Background(), notify.SimRestore, time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v, %v, %v", err, res.BeforeErr, res.AfterErr)
	}
	before := decodeReport[ReaderReport](t, res.Before[0].Details)
	if before.ReaderCheckpoint == nil || before.GroupCheckpoint == nil || before.CommitError == "" {
		t.Fatalf("before report %+v: want commits left unflushed", before)
	}
	// The stash is flushed at every interval: give it several.
	time.Sleep(500 * time.Millisecond)
	if at := committedAt(t, adm, group, topic, 0); at != 30 {
		t.Fatalf("committed offset %d after the restore, want 30: the stashed commit of offset 19 moved it back", at)
	}
	m, err := r.FetchMessage(ctx)
	if err != nil || m.Offset != 30 {
		t.Fatalf("first fetch after the restore: %d, %v; want 30", m.Offset, err)
	}
}

// TestReaderRecordsInApp: a group Reader's before-checkpoint report counts
// the records handed to the application and not committed (every restored
// copy finishes them; kcr restore counts them like carried records).
func TestReaderRecordsInApp(t *testing.T) {
	const topic, group = "inapp", "inappg"
	k := newFake(t, 1, topic)
	reg := notify.NewRegistry()
	log, _ := newLog(t)
	writeBatch(t, k.addrs, topic, log, 10)
	r := NewReader(groupConfig(k.addrs, group, topic, "inapp"), WithRegistry(reg), WithLogger(log), WithCommitWait(100*time.Millisecond))
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	fetchCommitInOrder(t, ctx, r, 2)
	for range 3 {
		if _, err := r.FetchMessage(ctx); err != nil {
			t.Fatal(err)
		}
	}
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
	rep := decodeReport[ReaderReport](t, res.Before[0].Details)
	if rep.ReaderCheckpoint == nil || rep.RecordsInApp != 3 {
		t.Fatalf("before report %v: want records_in_app 3 (offsets 2..4 handed, not committed)", res.Before[0].Details)
	}
	if rep.CommitWaitMS < 100 {
		t.Fatalf("before report %v: want commit_wait_ms >= 100 (the hook waits WithCommitWait for their commits)", res.Before[0].Details)
	}
}

// A commit waiting at the gate says its records were processed: they are
// not counted in the application's hands.
func TestHandedInAppWaiting(t *testing.T) {
	h := newHandedTable(nil)
	for o := int64(10); o < 20; o++ {
		h.note("t", 0, o)
	}
	h.note("t", 1, 5)
	h.committed([]kafka.Message{{Topic: "t", Partition: 0, Offset: 11}}) // commits 12
	if n := h.inApp(nil); n != 8+1 {
		t.Fatalf("inApp = %d, want 9 (12..19 of partition 0, 5 of partition 1)", n)
	}
	if n := h.inApp(map[tpKey]int64{{"t", 0}: 15, {"t", 1}: 5}); n != 4 {
		t.Fatalf("inApp with commits of 15 and 5 waiting = %d, want 4 (16..19)", n)
	}
	// A record fetched as the checkpoint began is dropped, not handed
	// out: neither it nor anything after it is in the application's hands.
	h.drop("t", 0, 18)
	h.drop("t", 0, 19)
	if n := h.inApp(map[tpKey]int64{{"t", 0}: 15, {"t", 1}: 5}); n != 2 {
		t.Fatalf("inApp with 18 and 19 dropped = %d, want 2 (16, 17)", n)
	}
}

// A commit that reaches the gate as the checkpoint begins (its records
// fetched before, processed, committed a moment late) is flushed before
// the kafka.Reader closes: the restored copy goes on after those records
// instead of being handed them again, and the waiting call returns nil.
// "late": the commit comes after the hook looked at the gate (the app
// still processing), and the hook waits for it (WithCommitWait); the soak's
// kafka-go service processed such records twice, as its restored copy was
// handed them again.
func TestReaderCommitsAtTheGate(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			const topic, group = "waitc", "waitcg"
			k := newFake(t, 1, topic)
			reg := notify.NewRegistry()
			log, _ := newLog(t)
			writeBatch(t, k.addrs, topic, log, 10)
			r := NewReader(groupConfig(k.addrs, group, topic, "waitc"), WithRegistry(reg), WithLogger(log))
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			fetchCommitInOrder(t, ctx, r, 2)
			var held []kafka.Message
			for range 3 {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, m)
			}
			committed := make(chan error, 1)
			var once sync.Once
			defer func(f func(*Reader)) { beforeFlushWaiting = f }(beforeFlushWaiting)
			beforeFlushWaiting = func(r *Reader) {
				once.Do(func() {
					go func() {
						if late {
							time.Sleep(150 * time.Millisecond) // the application still processing
						}
						committed <- r.CommitMessages(ctx, held...)
					}()
					for !late && r.waitingLen() == 0 {
						time.Sleep(time.Millisecond)
					}
				})
			}
			res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 5*time.Second)
			rep := decodeReport[ReaderReport](t, res.Before[0].Details)
			if rep.ReaderCheckpoint == nil || rep.CommitError != "" || rep.RecordsInApp != 0 || late && rep.CommitWaitMS < 100 {
				t.Fatalf("before report %v: want no commit error, nothing in the application's hands (and, late, commit_wait_ms >= 100)", res.Before[0].Details)
			}
			if err := <-committed; err != nil {
				t.Fatalf("the commit at the gate: %v", err)
			}
			if at := committedAt(t, admin(t, k.addrs), group, topic, 0); at != 5 {
				t.Fatalf("committed offset %d after the restore, want 5 (the commit sent before the reader left)", at)
			}
			if m, err := r.FetchMessage(ctx); err != nil || m.Offset != 5 {
				t.Fatalf("first fetch after the restore: offset %d, %v; want 5", m.Offset, err)
			}
		})
	}
}
