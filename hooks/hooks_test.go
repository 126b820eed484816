package hooks

import (
	"context"
	"io"
	"log/slog"
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
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	var idleClosed, before, after atomic.Int64
	OnCheckpoint("custom", func(context.Context) error { before.Add(1); return nil },
		func(context.Context, notify.Event) error { after.Add(1); return nil }, WithRegistry(reg))
	IdleConns("idle", idleCloser(func() { idleClosed.Add(1) }), WithRegistry(reg))

	release := make(chan struct{})
	inside := make(chan struct{})
	reg.Register("probe", notify.Func(func(context.Context) error {
		close(inside)
		<-release
		return nil
	}, nil))
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
