package quiesce

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitCountsTheCallerUntilTheGateOpens(t *testing.T) {
	open := make(chan struct{})
	blocked := &tellingCount{adds: make(chan int64, 2)}
	done := make(chan error)
	go func() { done <- Wait(context.Background(), open, blocked) }()
	select {
	case n := <-blocked.adds:
		if n != 1 {
			t.Fatalf("blocked = %d while a caller waits, want 1", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not count the caller")
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before the gate opened", err)
	default:
	}
	close(open)
	if err := <-done; err != nil {
		t.Fatalf("Wait = %v after the gate opened, want nil", err)
	}
	if n := blocked.Load(); n != 0 {
		t.Fatalf("blocked = %d after Wait returned, want 0", n)
	}
}

func TestWaitReturnsWhenCtxEnds(t *testing.T) {
	var blocked atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Wait(ctx, make(chan struct{}), &blocked); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if n := blocked.Load(); n != 0 {
		t.Fatalf("blocked = %d, want 0", n)
	}
}

func TestWaitZero(t *testing.T) {
	var n atomic.Int64
	n.Store(1)
	go func() {
		time.Sleep(5 * time.Millisecond)
		n.Add(-1)
	}()
	if !WaitZero(context.Background(), &n) || n.Load() != 0 {
		t.Fatalf("WaitZero returned before n reached 0 (n = %d)", n.Load())
	}

	n.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if WaitZero(ctx, &n) {
		t.Fatal("WaitZero = true with n stuck at 1")
	}
}

// tellingCount is a Counter that tells each new count on adds.
type tellingCount struct {
	atomic.Int64
	adds chan int64
}

func (c *tellingCount) Add(d int64) int64 {
	n := c.Int64.Add(d)
	c.adds <- n
	return n
}
