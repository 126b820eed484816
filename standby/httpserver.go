package standby

import (
	"context"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Bounds of the probe and metrics server (ServeProbes). A probe or a
// scrape is one short request: these bounds keep what a client on the
// pod's network can make kcr standby hold well under a megabyte or two,
// so that no client can push the container to an OOM kill (which would
// kill the service too).
const (
	ProbeReadHeaderTimeout = 5 * time.Second
	ProbeReadTimeout       = 10 * time.Second
	ProbeWriteTimeout      = 30 * time.Second
	ProbeIdleTimeout       = 15 * time.Second
	ProbeMaxHeaderBytes    = 8 << 10
	// ProbeMaxConns is how many connections are served at once; more
	// wait in the kernel's backlog.
	ProbeMaxConns = 32
)

// NewProbeServer is an http.Server for h with the Probe* bounds.
func NewProbeServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ProbeReadHeaderTimeout,
		ReadTimeout:       ProbeReadTimeout,
		WriteTimeout:      ProbeWriteTimeout,
		IdleTimeout:       ProbeIdleTimeout,
		MaxHeaderBytes:    ProbeMaxHeaderBytes,
	}
}

// ServeProbes serves h on ln with the Probe* bounds, at most ProbeMaxConns
// connections at once, until ctx ends; it then closes the server (and ln).
func ServeProbes(ctx context.Context, ln net.Listener, h http.Handler) {
	srv := NewProbeServer(h)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	srv.Serve(netutil.LimitListener(ln, ProbeMaxConns))
}
