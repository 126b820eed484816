package kafkahooks

import (
	"math/rand/v2"
	"sync/atomic"
)

// stripeCount cells, each on cache lines of its own: goroutines on
// different Ps rarely add to the same one.
const stripeCount = 8

// stripeSize keeps cells 128 bytes apart: the CPU's adjacent-line prefetch
// would otherwise pair two 64-byte lines.
const stripeSize = 128

// striped is a counter spread over padded cells, for counters that every
// call adds to and only a checkpoint reads. A single shared counter cost
// the Writer's WriteMessages some 110 ns per call under contention at
// -cpu 2 (BenchmarkHotPath/write-call), and its cache line held the state
// pointer that every call reads.
type striped struct {
	_     [stripeSize]byte // off the cache line of the fields before it
	cells [stripeCount]stripeCell
}

type stripeCell struct {
	n atomic.Int64
	_ [stripeSize - 8]byte
}

// cell returns a cell to add to; a call adds and subtracts through the same
// cell. runtime-backed rand is per-thread and takes a few nanoseconds.
func (s *striped) cell() *atomic.Int64 { return &s.cells[rand.Uint32()%stripeCount].n }

// Load returns the sum of the cells. It is not a snapshot: an add that
// races it may be missed, or a subtract seen without its add on another
// cell.
func (s *striped) Load() int64 {
	var t int64
	for i := range s.cells {
		t += s.cells[i].n.Load()
	}
	return t
}
