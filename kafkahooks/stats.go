package kafkahooks

import (
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

// addWriterStats adds the counters and summaries of b to a; gauges stay a's.
func addWriterStats(a *kafka.WriterStats, b kafka.WriterStats) {
	a.Dials += b.Dials
	a.Writes += b.Writes
	a.Messages += b.Messages
	a.Bytes += b.Bytes
	a.Errors += b.Errors
	a.Retries += b.Retries
	addDurationStats(&a.BatchTime, b.BatchTime)
	addDurationStats(&a.BatchQueueTime, b.BatchQueueTime)
	addDurationStats(&a.WriteTime, b.WriteTime)
	addDurationStats(&a.WaitTime, b.WaitTime)
	addDurationStats(&a.DialTime, b.DialTime)
	addSummaryStats(&a.BatchSize, b.BatchSize)
	addSummaryStats(&a.BatchBytes, b.BatchBytes)
}

// addReaderStats adds the counters and summaries of b to a; gauges stay a's.
func addReaderStats(a *kafka.ReaderStats, b kafka.ReaderStats) {
	a.Dials += b.Dials
	a.Fetches += b.Fetches
	a.Messages += b.Messages
	a.Bytes += b.Bytes
	a.Rebalances += b.Rebalances
	a.Timeouts += b.Timeouts
	a.Errors += b.Errors
	a.DeprecatedFetchesWithTypo += b.DeprecatedFetchesWithTypo
	addDurationStats(&a.DialTime, b.DialTime)
	addDurationStats(&a.ReadTime, b.ReadTime)
	addDurationStats(&a.WaitTime, b.WaitTime)
	addSummaryStats(&a.FetchSize, b.FetchSize)
	addSummaryStats(&a.FetchBytes, b.FetchBytes)
}
