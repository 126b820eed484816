package main

import (
	"context"
	"encoding/binary"
	"time"
)

// Cache stands for what a real service warms up before it serves: a lookup
// table filled by slow work. It is built in steps over the warm-up time, so
// that a cold start really takes that long, and it lives in the heap, so
// that it is part of the image.
type Cache struct {
	table []byte
}

// BuildCache fills a table of mb MiB, spread over at least warmup. It
// returns early with ctx's error.
func BuildCache(ctx context.Context, mb int, warmup time.Duration) (*Cache, error) {
	const step = 1 << 20
	size := mb * step
	if size < 8 {
		size = 8
	}
	c := &Cache{table: make([]byte, size)}
	start := time.Now()
	x := uint64(0x9e3779b97f4a7c15)
	for off := 0; off < size; off += step {
		end := min(off+step, size)
		for i := off; i+8 <= end; i += 8 {
			// xorshift64: pages with content, so that neither the kernel
			// nor CRIU can skip them as zero pages.
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(c.table[i:], x)
		}
		// Pace the steps so that the warm-up is spread over its time.
		due := start.Add(warmup * time.Duration(end) / time.Duration(size))
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(d):
			}
		}
	}
	return c, nil
}

// Score is the cached value for order n.
func (c *Cache) Score(n int64) uint64 {
	words := uint64(len(c.table) / 8)
	i := (uint64(n) * 0x9e3779b97f4a7c15) % words
	return binary.LittleEndian.Uint64(c.table[i*8:])
}

// Bytes is the size of the table.
func (c *Cache) Bytes() int { return len(c.table) }
