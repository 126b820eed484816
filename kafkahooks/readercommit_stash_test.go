package kafkahooks

import (
	"testing"

	"github.com/segmentio/kafka-go"
)

// A failed interval commit (the broker is down) must leave the batch for
// the checkpoint's flush, and a commit that lands must not remove an offset
// stashed while it was in flight.
func TestCommitStashKeepsFailedAndNewer(t *testing.T) {
	var c commitStash
	c.add([]kafka.Message{{Topic: "t", Partition: 0, Offset: 5}})
	msgs, done := c.take()
	if len(msgs) != 1 || msgs[0].Offset != 5 {
		t.Fatalf("take = %v; want offset 5", msgs)
	}
	done(false)
	if c.size() != 1 {
		t.Fatalf("after a failed commit %d partitions pending; want 1", c.size())
	}
	_, done = c.take()
	c.add([]kafka.Message{{Topic: "t", Partition: 0, Offset: 9}})
	done(true)
	msgs, _ = c.take()
	if len(msgs) != 1 || msgs[0].Offset != 9 {
		t.Fatalf("after a commit of 5 landed with 9 stashed, pending %v; want offset 9", msgs)
	}
}
