package kafkahooks

import (
	"reflect"
	"time"

	"github.com/segmentio/kafka-go"
)

// The Stats methods of kafka-go return counters since the last call and
// reset them. The Writer and Reader replace their kafka-go values at every
// checkpoint, so they keep the last counts of the retired values and add them
// to the next Stats call.

// addDurationStats merges b into a as addSummaryStats does; a duration is
// an int64 count of nanoseconds, so it goes through the same arithmetic.
func addDurationStats(a *kafka.DurationStats, b kafka.DurationStats) {
	s := summaryOf(*a)
	addSummaryStats(&s, summaryOf(b))
	*a = kafka.DurationStats{Avg: time.Duration(s.Avg), Min: time.Duration(s.Min),
		Max: time.Duration(s.Max), Count: s.Count, Sum: time.Duration(s.Sum)}
}

func summaryOf(d kafka.DurationStats) kafka.SummaryStats {
	return kafka.SummaryStats{Avg: int64(d.Avg), Min: int64(d.Min),
		Max: int64(d.Max), Count: d.Count, Sum: int64(d.Sum)}
}

// addSummaryStats merges b into a: an empty side takes the other whole, so a
// retired value's zero Min is never taken for an observation.
func addSummaryStats(a *kafka.SummaryStats, b kafka.SummaryStats) {
	if b.Count == 0 {
		return
	}
	if a.Count == 0 {
		*a = b
		return
	}
	a.Min = min(a.Min, b.Min)
	a.Max = max(a.Max, b.Max)
	a.Count += b.Count
	a.Sum += b.Sum
	a.Avg = a.Sum / a.Count
}

// addStats adds the counters and summaries of b to a; gauges and tags stay
// a's. It walks the fields by kafka-go's own `type:"counter"` tags, so a
// counter added in a later kafka-go version is carried without a change here.
func addStats[T kafka.WriterStats | kafka.ReaderStats](a *T, b T) {
	av, bv := reflect.ValueOf(a).Elem(), reflect.ValueOf(b)
	for i := range av.NumField() {
		f, bf := av.Field(i), bv.Field(i)
		switch p := f.Addr().Interface().(type) {
		case *kafka.DurationStats:
			addDurationStats(p, bf.Interface().(kafka.DurationStats))
		case *kafka.SummaryStats:
			addSummaryStats(p, bf.Interface().(kafka.SummaryStats))
		case *int64:
			if av.Type().Field(i).Tag.Get("type") == "counter" {
				*p += bf.Int()
			}
		}
	}
}
