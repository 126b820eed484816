package main

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

func order(n int) Record {
	id := fmt.Sprintf("order-%d", n)
	return Record{Key: id, Value: []byte(fmt.Sprintf(`{"id":%q,"n":%d}`, id, n))}
}

func result(n int, seq uint64, inst string, gen uint64, at time.Time) Record {
	id := fmt.Sprintf("order-%d", n)
	return Record{
		Key:       id,
		Value:     []byte(fmt.Sprintf(`{"order":%q,"n":%d,"pid":42}`, id, n)),
		Headers:   map[string]string{"seq": fmt.Sprint(seq), "gen": fmt.Sprint(gen), "instance": inst},
		Timestamp: at,
	}
}

func TestReport(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tl := NewTally()
	// Results may be read before their orders: the topics are read together.
	tl.AddResult(result(1, 1, "aaaa", 0, t0))
	for n := 1; n <= 12; n++ {
		tl.AddOrder(order(n))
	}
	tl.AddOrder(order(5)) // resent by the producer
	tl.AddResult(result(2, 2, "aaaa", 0, t0.Add(time.Second)))
	tl.AddResult(result(3, 3, "aaaa", 0, t0.Add(2*time.Second)))
	// Restored instance: continues the sequence; order 3 processed twice.
	tl.AddResult(result(3, 4, "bbbb", 1, t0.Add(5*time.Second)))
	tl.AddResult(result(4, 6, "bbbb", 1, t0.Add(6*time.Second))) // seq 5 skipped
	tl.AddResult(result(99, 7, "bbbb", 1, t0.Add(7*time.Second)))
	tl.AddResult(Record{Value: []byte("junk")})

	if got := tl.Missing(); got != 8 {
		t.Errorf("Missing() = %d, want 8", got)
	}
	r := tl.Report()
	want := Report{
		OrderRecords: 13, Orders: 12, DupOrders: 1,
		ResultRecords: 7, Results: 4,
		Missing:      8,
		MissingFirst: []string{"order-5", "order-6", "order-7", "order-8", "order-9", "order-10", "order-11", "order-12"},
		Duplicates:   1, DupFirst: []string{"order-3"},
		Unexpected: 1, Undecoded: 1,
		SeqMax: 7, SeqGaps: 1,
	}
	insts := r.Instances
	r.Instances = nil
	if !reflect.DeepEqual(r, want) {
		t.Errorf("report:\n got %+v\nwant %+v", r, want)
	}
	if len(insts) != 2 || insts[0].ID != "aaaa" || insts[1].ID != "bbbb" {
		t.Fatalf("instances: %+v", insts)
	}
	if a, b := insts[0], insts[1]; a.Results != 3 || a.SeqMin != 1 || a.SeqMax != 3 || a.Generation != 0 ||
		b.Results != 3 || b.SeqMin != 4 || b.SeqMax != 7 || b.Generation != 1 ||
		!b.First.Equal(t0.Add(5*time.Second)) || !reflect.DeepEqual(b.PIDs, []int{42}) {
		t.Errorf("instances: %+v %+v", *a, *b)
	}
}

func TestReportOK(t *testing.T) {
	tl := NewTally()
	if tl.Report().OK {
		t.Error("an empty run passed")
	}
	for n := 1; n <= 1000; n++ {
		tl.AddOrder(order(n))
		tl.AddResult(result(n, uint64(n), "x", 0, time.Time{}))
	}
	tl.AddResult(result(7, 1001, "x", 0, time.Time{}))
	r := tl.Report()
	if !r.OK || r.Missing != 0 || r.Duplicates != 1 || r.Results != 1000 || len(r.MissingFirst) != 0 {
		t.Errorf("report: %+v", r)
	}
}

func TestFirstByNumber(t *testing.T) {
	got := firstByNumber([]string{"order-10", "order-9", "x", "order-100", "order-2"}, 3)
	if want := []string{"x", "order-2", "order-9"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
