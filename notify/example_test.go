package notify_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// connPool stands for any resource a service holds across a checkpoint: a
// database pool, an HTTP client's connections.
type connPool struct{ clientID string }

func newPool() *connPool                               { return &connPool{clientID: "svc"} }
func (p *connPool) CloseAll(ctx context.Context) error { return nil }
func (p *connPool) Reopen(ctx context.Context) error   { return nil }
func (p *connPool) SetClientID(id string)              { p.clientID = id }

// The README's snippet: a service registers its resources with the default
// registry and opens the control socket kcr talks to (it binds a socket, so
// it does not run here).
func Example() {
	pool := newPool()
	notify.Register("db-pool", notify.Func(
		func(ctx context.Context) error { return pool.CloseAll(ctx) }, // before checkpoint
		func(ctx context.Context, ev notify.Event) error { // after restore or resume
			if ev.Kind == notify.Restore {
				pool.SetClientID("svc-" + ev.InstanceID[:8]) // a new instance: new identity
			}
			return pool.Reopen(ctx)
		},
	))
	srv, err := notify.Start() // the control socket kcr talks to
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
}

// Hooks run in reverse registration order before a checkpoint and in
// registration order after it; Simulate runs that cycle in-process, as a
// service's own tests would.
func ExampleRegistry_Register() {
	reg := notify.NewRegistry()
	for _, name := range []string{"db", "cache"} {
		reg.Register(name, notify.Func(
			func(ctx context.Context) error { fmt.Println("before checkpoint:", name); return nil },
			func(ctx context.Context, ev notify.Event) error { fmt.Println("after:", name, ev.Kind); return nil },
		))
	}
	_, before := reg.Identity()
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("new instance id:", res.Event.InstanceID != before, "generation:", res.Event.Generation)
	// Output:
	// before checkpoint: cache
	// before checkpoint: db
	// after: db restore
	// after: cache restore
	// new instance id: true generation: 1
}

// A failed before-checkpoint hook cancels the dump: every resource is still
// notified, and all of them resume.
func ExampleRegistry_Simulate() {
	reg := notify.NewRegistry()
	reg.Register("db", notify.Func(nil, func(ctx context.Context, ev notify.Event) error {
		fmt.Println("db:", ev.Kind)
		return nil
	}))
	reg.Register("broken", notify.Func(func(ctx context.Context) error {
		return errors.New("cannot flush")
	}, nil))
	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.BeforeErr)
	// Output:
	// db: resume
	// resource "broken" before-checkpoint: cannot flush
}

// A resource that keeps records in memory declares them with Carrying: they
// are part of the image. Under RequireDrained (kcr checkpoint
// --require-drained) Carrying vetoes the checkpoint instead.
func ExampleCarrying() {
	pending := int64(3) // accepted by the application, not yet delivered
	reg := notify.NewRegistry()
	reg.Register("writer", notify.Func(func(ctx context.Context) error {
		if notify.RequireDrained(ctx) {
			fmt.Println("asked to drain")
		}
		return notify.Carrying(ctx, pending)
	}, nil))

	res, err := reg.Simulate(context.Background(), notify.SimRestore, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("carried:", res.Before[0].Carried, "error:", res.BeforeErr)

	res, err = reg.Simulate(notify.WithRequireDrained(context.Background()), notify.SimRestore, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	var ce *notify.CarryError
	fmt.Println("veto:", errors.As(res.BeforeErr, &ce), ce.Records, "records; then", res.Event.Kind)
	// Output:
	// carried: 3 error: <nil>
	// asked to drain
	// veto: true 3 records; then resume
}

// With kcr checkpoint --leave-running the process goes on after the dump, so
// a hook may keep what only one live process may hold.
func ExampleLeaveRunning() {
	reg := notify.NewRegistry()
	reg.Register("consumer", notify.Func(
		func(ctx context.Context) error {
			if notify.LeaveRunning(ctx) {
				fmt.Println("keeping the group membership")
				return nil
			}
			fmt.Println("leaving the group")
			return nil
		},
		func(ctx context.Context, ev notify.Event) error { fmt.Println("after:", ev.Kind); return nil },
	))
	for _, o := range []notify.SimOutcome{notify.SimLeaveRunning, notify.SimRestore} {
		if _, err := reg.Simulate(context.Background(), o, 5*time.Second); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// keeping the group membership
	// after: resume
	// leaving the group
	// after: restore
}

// The service side of kcr standby --listen: the listening socket comes
// from LISTEN_FDS and stays kcr's across checkpoints (docs/standby.md;
// needs kcr standby, so it does not run).
func ExampleListeners() {
	lns, err := notify.Listeners() // LISTEN_FDS; none when run without --listen
	if err != nil {
		log.Fatal(err)
	}
	var inflight sync.WaitGroup
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inflight.Add(1)
		defer inflight.Done()
		notify.Touch() // a request is work: no sleep while they come
		fmt.Fprintln(w, "hello")
	})}
	// Registered after Listeners, so it runs first before a checkpoint. Not
	// srv.Shutdown: it would close the listener for good.
	notify.Register("http", notify.Func(func(ctx context.Context) error {
		srv.SetKeepAlivesEnabled(false) // closes idle connections: CRIU does not dump open TCP connections
		inflight.Wait()
		return nil
	}, func(ctx context.Context, ev notify.Event) error {
		srv.SetKeepAlivesEnabled(true)
		return nil
	}))
	go srv.Serve(lns[0])
}
