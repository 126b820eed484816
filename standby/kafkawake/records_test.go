package kafkawake

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// batch encodes a record batch header of v2 (the records themselves are
// not read) with n records from first, attributes attrs and producer pid.
func batch(first int64, n int32, attrs int16, pid int64) []byte {
	b := kmsg.RecordBatch{FirstOffset: first, Magic: 2, Attributes: attrs, LastOffsetDelta: n - 1,
		ProducerID: pid, NumRecords: n, Records: make([]byte, n)}
	b.Length = int32(49 + len(b.Records))
	return b.AppendTo(nil)
}

// records counts what a read_committed consumer is handed from a position:
// not markers, not aborted batches, not records before the position, and
// stops at a batch cut by the size limit.
func TestRecords(t *testing.T) {
	const txn, ctl = 0x10, 0x20
	aborted := []kmsg.FetchResponseTopicPartitionAbortedTransaction{{ProducerID: 7, FirstOffset: 10}}
	var data []byte
	data = append(data, batch(0, 5, 0, -1)...)       // 0-4: before the position, partly
	data = append(data, batch(5, 3, txn, 9)...)      // 5-7: committed transaction
	data = append(data, batch(8, 1, txn|ctl, 9)...)  // 8: its commit marker
	data = append(data, batch(9, 1, txn|ctl, 3)...)  // 9: another marker
	data = append(data, batch(10, 4, txn, 7)...)     // 10-13: aborted
	data = append(data, batch(14, 1, txn|ctl, 7)...) // 14: the abort marker
	data = append(data, batch(15, 2, txn, 7)...)     // 15-16: producer 7 again, committed
	cut := batch(17, 2, 0, -1)
	data = append(data, cut[:len(cut)-1]...) // 17-18: cut
	n, next := records(data, 3, aborted)
	if want := int64(2 + 3 + 2); n != want || next != 17 {
		t.Errorf("records from 3: %d, next %d; want %d, next 17", n, next, want)
	}
	n, next = records(data[len(data)-len(cut)+1:], 17, nil)
	if n != 0 || next != 17 {
		t.Errorf("a cut batch alone: %d, next %d; want 0, next 17", n, next)
	}
	markers := append(batch(20, 1, txn|ctl, 9), batch(21, 1, txn|ctl, 3)...)
	if n, next := records(markers, 20, nil); n != 0 || next != 22 {
		t.Errorf("markers only: %d, next %d; want 0, next 22", n, next)
	}
}
