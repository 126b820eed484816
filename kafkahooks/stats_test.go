package kafkahooks

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestAddDurationStats(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		a, b kafka.DurationStats
		want kafka.DurationStats
	}{
		{"empty b keeps a",
			kafka.DurationStats{Avg: 2 * ms, Min: ms, Max: 3 * ms, Count: 2, Sum: 4 * ms},
			kafka.DurationStats{},
			kafka.DurationStats{Avg: 2 * ms, Min: ms, Max: 3 * ms, Count: 2, Sum: 4 * ms}},
		{"empty a takes b",
			kafka.DurationStats{},
			kafka.DurationStats{Avg: 5 * ms, Min: 5 * ms, Max: 5 * ms, Count: 1, Sum: 5 * ms},
			kafka.DurationStats{Avg: 5 * ms, Min: 5 * ms, Max: 5 * ms, Count: 1, Sum: 5 * ms}},
		{"both merge",
			kafka.DurationStats{Avg: 2 * ms, Min: ms, Max: 3 * ms, Count: 2, Sum: 4 * ms},
			kafka.DurationStats{Avg: 8 * ms, Min: 8 * ms, Max: 8 * ms, Count: 1, Sum: 8 * ms},
			kafka.DurationStats{Avg: 4 * ms, Min: ms, Max: 8 * ms, Count: 3, Sum: 12 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addDurationStats(&tc.a, tc.b)
			if tc.a != tc.want {
				t.Fatalf("got %+v, want %+v", tc.a, tc.want)
			}
		})
	}
}

func TestAddSummaryStats(t *testing.T) {
	a := kafka.SummaryStats{Avg: 10, Min: 10, Max: 10, Count: 1, Sum: 10}
	addSummaryStats(&a, kafka.SummaryStats{Avg: 25, Min: 20, Max: 30, Count: 2, Sum: 50})
	want := kafka.SummaryStats{Avg: 20, Min: 10, Max: 30, Count: 3, Sum: 60}
	if a != want {
		t.Fatalf("got %+v, want %+v", a, want)
	}
}

func TestAddStatsCountersAndSummaries(t *testing.T) {
	d := kafka.DurationStats{Avg: time.Second, Min: time.Second, Max: time.Second, Count: 1, Sum: time.Second}
	s := kafka.SummaryStats{Avg: 4, Min: 4, Max: 4, Count: 1, Sum: 4}
	w := kafka.WriterStats{Writes: 1, Messages: 2, Bytes: 3, Errors: 4, Retries: 5, Dials: 6,
		BatchTime: d, BatchQueueTime: d, WriteTime: d, WaitTime: d, DialTime: d, BatchSize: s, BatchBytes: s,
		MaxAttempts: 7, Rebalances: 8, Topic: "old"}
	old := kafka.WriterStats{Writes: 10, Messages: 20, Bytes: 30, Errors: 40, Retries: 50, Dials: 60,
		BatchTime: d, BatchQueueTime: d, WriteTime: d, WaitTime: d, DialTime: d, BatchSize: s, BatchBytes: s,
		MaxAttempts: 70, Rebalances: 80, Topic: "retired"}
	addStats(&w, old)
	d2 := kafka.DurationStats{Avg: time.Second, Min: time.Second, Max: time.Second, Count: 2, Sum: 2 * time.Second}
	s2 := kafka.SummaryStats{Avg: 4, Min: 4, Max: 4, Count: 2, Sum: 8}
	want := kafka.WriterStats{Writes: 11, Messages: 22, Bytes: 33, Errors: 44, Retries: 55, Dials: 66,
		BatchTime: d2, BatchQueueTime: d2, WriteTime: d2, WaitTime: d2, DialTime: d2, BatchSize: s2, BatchBytes: s2,
		MaxAttempts: 7, Rebalances: 8, Topic: "old"} // gauges, untagged fields and tags stay
	if w != want {
		t.Fatalf("writer:\n got %+v\nwant %+v", w, want)
	}

	r := kafka.ReaderStats{Dials: 1, Fetches: 2, Messages: 3, Bytes: 4, Rebalances: 5, Timeouts: 6, Errors: 7,
		DeprecatedFetchesWithTypo: 2, ReadTime: d, FetchSize: s, Offset: 100, Lag: 3, ClientID: "c"}
	addStats(&r, kafka.ReaderStats{Dials: 1, Fetches: 1, Messages: 1, Bytes: 1, Rebalances: 1, Timeouts: 1,
		Errors: 1, DeprecatedFetchesWithTypo: 1, ReadTime: d, FetchSize: s, Offset: 50, Lag: 9, ClientID: "x"})
	wantR := kafka.ReaderStats{Dials: 2, Fetches: 3, Messages: 4, Bytes: 5, Rebalances: 6, Timeouts: 7, Errors: 8,
		DeprecatedFetchesWithTypo: 3, ReadTime: d2, FetchSize: s2, Offset: 100, Lag: 3, ClientID: "c"}
	if r != wantR {
		t.Fatalf("reader:\n got %+v\nwant %+v", r, wantR)
	}
}

// BenchmarkAddStats is the cost a Stats call pays to carry the counts of
// the retired kafka-go values (one addStats per call).
func BenchmarkAddStats(b *testing.B) {
	d := kafka.DurationStats{Avg: time.Second, Min: time.Second, Max: time.Second, Count: 1, Sum: time.Second}
	acc := kafka.WriterStats{Writes: 1, BatchTime: d, WriteTime: d}
	for b.Loop() {
		st := kafka.WriterStats{Writes: 2, BatchTime: d, WriteTime: d}
		addStats(&st, acc)
	}
}
