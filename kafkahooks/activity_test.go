package kafkahooks

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/notify"
)

// Records written, fetched and committed through the hooks count as
// activity on their registry; a fetch that waits on an empty topic does not.
func TestActivityCounts(t *testing.T) {
	f := newFake(t, 1, "act")
	log, _ := newLog(t)
	reg := notify.NewRegistry()
	w := NewWriter(&kafka.Writer{Addr: kafka.TCP(f.addrs...), Topic: "act", BatchTimeout: time.Millisecond},
		WithRegistry(reg), WithLogger(log))
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte("a")}, kafka.Message{Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if n := reg.Activity().Count; n != 2 {
		t.Fatalf("after writing 2 records: count %d, want 2", n)
	}
	r := NewReader(kafka.ReaderConfig{Brokers: f.addrs, Topic: "act", GroupID: "actg", MaxWait: 50 * time.Millisecond},
		WithRegistry(reg), WithLogger(log))
	defer r.Close()
	for range 2 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if n := reg.Activity().Count; n != 6 {
		t.Fatalf("after fetching and committing 2 records: count %d, want 6", n)
	}
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	if _, err := r.FetchMessage(wctx); err == nil {
		t.Fatal("fetch on a drained topic returned a record")
	}
	if n := reg.Activity().Count; n != 6 {
		t.Fatalf("an empty fetch counted: %d, want 6", n)
	}
}
