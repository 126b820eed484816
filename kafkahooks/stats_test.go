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
