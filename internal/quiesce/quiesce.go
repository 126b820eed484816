// Package quiesce holds what the Kafka client wrappers of kafkahooks and
// kgohooks share at their gates: a caller waiting while a checkpoint runs,
// counted so that the hook's report can say how many waited, and a hook
// waiting for the calls already inside the client to leave.
package quiesce

import (
	"context"
	"time"
)

// Counter is the count of waiting callers: an *atomic.Int64, or a type
// that also signals its changes.
type Counter interface{ Add(delta int64) int64 }

// Wait blocks until open is closed or ctx ends, counting the caller in
// blocked meanwhile. It returns ctx.Err() if ctx ended first.
func Wait(ctx context.Context, open <-chan struct{}, blocked Counter) error {
	blocked.Add(1)
	defer blocked.Add(-1)
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitZero polls n, with a backoff from 20 µs to 5 ms, until it is 0 or
// ctx ends, and reports whether it reached 0. Calls inside a client leave
// in microseconds, and have no signal of their own to wait on.
func WaitZero(ctx context.Context, n interface{ Load() int64 }) bool {
	for d := 20 * time.Microsecond; n.Load() > 0; d = min(2*d, 5*time.Millisecond) {
		select {
		case <-ctx.Done():
			return n.Load() == 0
		case <-time.After(d):
		}
	}
	return true
}
