package kafkahooks

import (
	"sync"
	"testing"
	"unsafe"
)

// The stripes sum exactly once every add is done, whichever cells the adds
// and subtracts went to, and sit on cache lines of their own.
func TestStriped(t *testing.T) {
	var s striped
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10000 {
				c := s.cell()
				c.Add(3)
				s.cell().Add(-1) // another cell, as a Completion does
				c.Add(-2)
			}
		}()
	}
	wg.Wait()
	if n := s.Load(); n != 0 {
		t.Fatalf("sum %d after balanced adds, want 0", n)
	}
	if d := unsafe.Offsetof(s.cells) % stripeSize; d != 0 || unsafe.Sizeof(stripeCell{}) != stripeSize {
		t.Errorf("cells at offset %d, size %d: want multiples of %d", unsafe.Offsetof(s.cells), unsafe.Sizeof(stripeCell{}), stripeSize)
	}
}

// A sum that sees a Completion's subtraction before the add it undoes
// still counts the calls inside kafka-go right.
func TestWriterCountsRounding(t *testing.T) {
	w := &Writer{}
	w.inflight.cells[0].n.Add(callUnit + 5) // a call with 5 records
	w.inflight.cells[1].n.Add(-7)           // a Completion whose add is not seen
	if calls, recs := w.counts(); calls != 1 || recs != 0 {
		t.Errorf("counts = %d calls, %d records; want 1, 0", calls, recs)
	}
	w.inflight.cells[2].n.Add(9)
	if calls, recs := w.counts(); calls != 1 || recs != 7 {
		t.Errorf("counts = %d calls, %d records; want 1, 7", calls, recs)
	}
	w.inflight.cells[0].n.Add(-callUnit)
	if w.callsInside() {
		t.Error("a call is inside after it left")
	}
}
