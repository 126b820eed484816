package kafkahooks

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// TestConnsAndHelpers: TrackConns closes every connection of an HTTP client
// (busy or idle) before the checkpoint and holds new dials until the
// restore; IdleConns and OnCheckpoint take part in the cycle.
func TestConnsAndHelpers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	reg := notify.NewRegistry()
	log, _ := newLog(t)

	var idleClosed, before, after atomic.Int64
	OnCheckpoint("custom", func(context.Context) error { before.Add(1); return nil },
		func(context.Context, notify.Event) error { after.Add(1); return nil }, WithRegistry(reg))
	IdleConns("idle", idleCloser(func() { idleClosed.Add(1) }), WithRegistry(reg))

	release := make(chan struct{})
	inside := make(chan struct{})
	hook(reg, func(context.Context) error {
		close(inside)
		<-release
		return nil
	}, nil)
	conns := TrackConns("schema-registry", nil, WithRegistry(reg), WithLogger(log))
	defer conns.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: conns.DialContext}}
	get := func() error {
		res, err := client.Get(srv.URL)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, res.Body)
		return res.Body.Close()
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}
	if conns.Open() != 1 {
		t.Fatalf("%d tracked connections, want 1 (kept alive)", conns.Open())
	}

	sim := make(chan notify.SimResult, 1)
	go func() {
		res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		sim <- res
	}()
	<-inside
	if conns.Open() != 0 {
		t.Fatalf("%d tracked connections open during the checkpoint", conns.Open())
	}
	got := make(chan error, 1)
	go func() { got <- get() }() // must wait for a connection until the restore
	select {
	case err := <-got:
		t.Fatalf("request during the checkpoint returned %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	res := <-sim
	if err := <-got; err != nil {
		t.Fatalf("request held across the checkpoint: %v", err)
	}
	if before.Load() != 1 || after.Load() != 1 || idleClosed.Load() != 1 {
		t.Fatalf("hooks ran %d/%d times, idle closed %d times", before.Load(), after.Load(), idleClosed.Load())
	}
	for _, r := range res.Before {
		if r.Name == "schema-registry" && r.Details["connections_closed"] != 1 {
			t.Fatalf("report %v", r.Details)
		}
	}
}

type idleCloser func()

func (f idleCloser) CloseIdleConnections() { f() }

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
		tr := newConnTracker(dial, nil)
		res := make(chan error, 1)
		go func() {
			c, err := tr.DialContext(context.Background(), "tcp", "x")
			if c != nil {
				c.Close()
			}
			res <- err
		}()
		waitFor(t, 5*time.Second, "dial in progress", func() bool { return inDial.Load() == 1 })
		start := time.Now()
		tr.closeAll(permanent)
		if inDial.Load() != 0 || time.Since(start) > 500*time.Millisecond {
			t.Fatalf("permanent=%v: closeAll returned after %v with %d dials in progress", permanent, time.Since(start), inDial.Load())
		}
		if permanent {
			if err := <-res; !errors.Is(err, ErrConnsClosed) {
				t.Fatalf("aborted dial: %v, want ErrConnsClosed", err)
			}
			continue
		}
		select {
		case err := <-res:
			t.Fatalf("dial returned %v while paused", err)
		case <-time.After(50 * time.Millisecond):
		}
		tr.resume()
		if err := <-res; err != nil || attempts.Load() != 2 {
			t.Fatalf("dial after resume: %v after %d attempts", err, attempts.Load())
		}
	}
}
