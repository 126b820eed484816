package hooks_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/kcr-dev/kcr/hooks"
	"github.com/kcr-dev/kcr/notify"
)

// OnCheckpoint registers hooks of your own, for a client that needs custom
// quiescing, such as a database pool.
func ExampleOnCheckpoint() {
	reg := notify.NewRegistry()
	unregister := hooks.OnCheckpoint("db-pool",
		func(ctx context.Context) error { fmt.Println("closing the pool"); return nil },
		func(ctx context.Context, ev notify.Event) error { fmt.Println("reopening after", ev.Kind); return nil },
		hooks.WithRegistry(reg))
	defer unregister()
	if _, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second); err != nil {
		log.Fatal(err)
	}
	// Output:
	// closing the pool
	// reopening after restore
}

// TrackConns closes every connection of an HTTP client before a checkpoint;
// the client reconnects on its own afterwards.
func ExampleTrackConns() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	reg := notify.NewRegistry()
	conns := hooks.TrackConns("schema-registry", nil, hooks.WithRegistry(reg))
	defer conns.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: conns.DialContext}}
	get := func() {
		res, err := client.Get(srv.URL)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	get()
	fmt.Println("open before:", conns.Open())
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("closed by the checkpoint:", res.Before[0].Details["connections_closed"], "open:", conns.Open())
	get()
	fmt.Println("open after:", conns.Open())
	// Output:
	// open before: 1
	// closed by the checkpoint: 1 open: 0
	// open after: 1
}

// IdleConns closes an http.Transport's idle connections before every
// checkpoint.
func ExampleIdleConns() {
	reg := notify.NewRegistry()
	tr := &http.Transport{}
	defer hooks.IdleConns("http", tr, hooks.WithRegistry(reg))()
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Before[0].Name, res.BeforeErr)
	// Output: http <nil>
}
