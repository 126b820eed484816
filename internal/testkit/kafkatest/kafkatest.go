// Package kafkatest holds the Kafka scaffolding of kcr's tests: an
// in-process kfake cluster, a fault for OffsetCommit, and readers that check
// a topic with a client of their own.
package kafkatest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Cluster starts an in-process kfake cluster of one broker with opts
// (topics, group settings, faults), closed when the test ends, and returns
// it with its addresses.
func Cluster(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

// FastGroups lets group members use session timeouts down to 50 ms, so that
// tests see a lost member within their time.
func FastGroups() kfake.Opt { return kfake.GroupMinSessionTimeout(50 * time.Millisecond) }

// FailCommit answers every partition of an OffsetCommit request with the
// error code, as a kfake control function does.
func FailCommit(req kmsg.Request, code int16) kmsg.Response {
	creq := req.(*kmsg.OffsetCommitRequest)
	resp := creq.ResponseKind().(*kmsg.OffsetCommitResponse)
	for _, rt := range creq.Topics {
		st := kmsg.NewOffsetCommitResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewOffsetCommitResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// ReadTopic reads every record of topic, from the start to the end offsets
// at the time of the call, with a franz-go client of its own (opts added to
// its options), and fails t if they have not all come within 20 s.
func ReadTopic(t testing.TB, addrs []string, topic string, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	return ReadTo(t, 20*time.Second, addrs, topic, nil, opts...)
}

// ReadTo is ReadTopic up to ends (partition to end offset; nil: the end
// offsets at the time of the call) within d: for a caller that lists the
// end offsets its own way, or waits longer. Fetch errors are logged, and a
// partition that cannot be read fails t at d.
func ReadTo(t testing.TB, d time.Duration, addrs []string, topic string, ends map[int32]int64, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if ends == nil {
		listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		ends = map[int32]int64{}
		listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	}
	want := map[int32]int64{}
	for p, end := range ends {
		if end > 0 {
			want[p] = end
		}
	}
	var recs []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %v (still want %v)", topic, err, want)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Logf("reading %s/%d: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset < end {
				recs = append(recs, r)
				if r.Offset+1 >= end {
					delete(want, r.Partition)
				}
			}
		})
	}
	return recs
}

// Poller is what PollValues needs of a kgo.Client, a kgohooks.Client or a
// GroupTransactSession.
type Poller interface {
	PollFetches(context.Context) kgo.Fetches
}

// PollValues polls p and appends the values to got until it holds n or ctx
// ends.
func PollValues(ctx context.Context, p Poller, got []string, n int) []string {
	for len(got) < n && ctx.Err() == nil {
		p.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// PollMore polls p 300 ms longer and appends what comes, so that records
// delivered again show.
func PollMore(ctx context.Context, p Poller, got []string) []string {
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	p.PollFetches(short).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	return got
}

// ReadValues reads topic from the start with a franz-go client of its own
// (opts added) until want records arrived or 30 s passed, then 300 ms more,
// and returns the values. The bound is long for a loaded CI machine (5 s
// once read nothing there); a reader that gets its count returns at once. Unlike ReadTopic it stops at a count, not at the
// end offsets: a read_committed reader never reaches those past an aborted
// transaction.
func ReadValues(t testing.TB, addrs []string, topic string, want int, opts ...kgo.Opt) []string {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return PollMore(ctx, cl, PollValues(ctx, cl, nil, want))
}

// RebalanceDelay is what InitialRebalanceDelay installed: it counts the
// joins it holds.
type RebalanceDelay struct{ holding, held atomic.Int32 }

// Holding is the number of joins the delay holds now.
func (r *RebalanceDelay) Holding() int { return int(r.holding.Load()) }

// Held is the number of joins the delay held so far.
func (r *RebalanceDelay) Held() int { return int(r.held.Load()) }

// InitialRebalanceDelay makes c hold the join of an empty classic group
// for d, as a broker does with group.initial.rebalance.delay.ms (kfake has
// no such setting): a JoinGroup that makes a member (one with a member id,
// or of a version before MEMBER_ID_REQUIRED) waits d if the group has no
// member when it arrives. Joins into a group with members pass at once.
func InitialRebalanceDelay(t testing.TB, c *kfake.Cluster, d time.Duration) *RebalanceDelay {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ClientID("kafkatest-delay"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	r := &RebalanceDelay{}
	c.ControlKey(int16(kmsg.JoinGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.JoinGroupRequest)
		if req.MemberID == "" && req.Version >= 4 {
			return nil, nil, false
		}
		// Asleep, the cluster goes on serving, the describe among others.
		c.SleepControl(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ds, err := adm.DescribeGroups(ctx, req.Group)
			if err != nil {
				return
			}
			if g := ds[req.Group]; g.Err == nil && len(g.Members) > 0 {
				return
			}
			r.holding.Add(1)
			r.held.Add(1)
			time.Sleep(d)
			r.holding.Add(-1)
		})
		return nil, nil, false
	})
	return r
}

// ProduceTxn produces n records to partition p of topic in one transaction
// of a transactional producer of its own, committed or aborted.
func ProduceTxn(t testing.TB, addrs []string, topic string, p int32, n int, commit bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID(fmt.Sprintf("kafkatest-%d", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}
