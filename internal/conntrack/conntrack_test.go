package conntrack

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// TestTrackerAbortsDials: a dial still connecting when the connections are
// closed (a socket CRIU could not checkpoint) is aborted before closeAll
// returns; in pause mode it is retried after the resume.
func TestTrackerAbortsDials(t *testing.T) {
	var attempts atomic.Int64
	var inDial atomic.Int64
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		if attempts.Add(1) == 1 {
			inDial.Add(1)
			<-ctx.Done() // a connect that does not complete
			inDial.Add(-1)
			return nil, ctx.Err()
		}
		c1, c2 := net.Pipe()
		go func() { io.Copy(io.Discard, c2) }()
		return c1, nil
	}
	for _, permanent := range []bool{true, false} {
		attempts.Store(0)
		tr := New(dial, nil)
		res := make(chan error, 1)
		go func() {
			c, err := tr.DialContext(context.Background(), "tcp", "x")
			if c != nil {
				c.Close()
			}
			res <- err
		}()
		wait.For(t, 5*time.Second, "dial in progress", func() bool { return inDial.Load() == 1 })
		start := time.Now()
		tr.CloseAll(permanent)
		if inDial.Load() != 0 || time.Since(start) > 500*time.Millisecond {
			t.Fatalf("permanent=%v: CloseAll returned after %v with %d dials in progress", permanent, time.Since(start), inDial.Load())
		}
		if permanent {
			if err := <-res; !errors.Is(err, ErrClosed) {
				t.Fatalf("aborted dial: %v, want ErrClosed", err)
			}
			continue
		}
		select {
		case err := <-res:
			t.Fatalf("dial returned %v while paused", err)
		case <-time.After(50 * time.Millisecond):
		}
		tr.Resume()
		if err := <-res; err != nil || attempts.Load() != 2 {
			t.Fatalf("dial after resume: %v after %d attempts", err, attempts.Load())
		}
	}
}
