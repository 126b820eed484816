package standby

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serveProbesForTest serves an "ok" handler through ServeProbes on a
// loopback port and returns its address.
func serveProbesForTest(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		ServeProbes(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes c within d (reading
// whatever it sends first).
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil // EOF: the server closed it; a timeout is an error
}

// Each bound of the probe server, on the server ServeProbes runs: without
// it, a client holds a connection or memory for as long as it likes.
func TestProbeServerBounds(t *testing.T) {
	srv := NewProbeServer(http.NotFoundHandler())
	if srv.ReadHeaderTimeout != ProbeReadHeaderTimeout || srv.IdleTimeout != ProbeIdleTimeout ||
		srv.MaxHeaderBytes != ProbeMaxHeaderBytes || srv.ReadTimeout != ProbeReadTimeout || srv.WriteTimeout != ProbeWriteTimeout {
		t.Fatalf("NewProbeServer: %+v: want every Probe* bound set", srv)
	}
	addr := serveProbesForTest(t)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("header size", func(t *testing.T) {
		t.Parallel()
		c := dial()
		// More than MaxHeaderBytes (plus net/http's 4 KiB of slack).
		req := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2*ProbeMaxHeaderBytes+4096) + "\r\n\r\n"
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte(req))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("oversized header: %v, want a 431 answer", err)
		}
		if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("oversized header: status %d, want 431", res.StatusCode)
		}
	})

	t.Run("unfinished header", func(t *testing.T) {
		t.Parallel()
		c := dial()
		c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")) // never ends
		if !closedWithin(c, ProbeReadHeaderTimeout+20*time.Second) {
			t.Errorf("a connection whose header never ends is still open after %v", ProbeReadHeaderTimeout+20*time.Second)
		}
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		t.Parallel()
		c := dial()
		c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("GET: %v %v", res, err)
		}
		io.Copy(io.Discard, res.Body)
		c.SetReadDeadline(time.Now().Add(ProbeIdleTimeout + 20*time.Second))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("an idle keep-alive connection: %v after %v, want closed (EOF)", err, ProbeIdleTimeout+20*time.Second)
		}
	})

}

// The connection cap: connection ProbeMaxConns+1 waits until one closes.
func TestProbeServerConnCap(t *testing.T) {
	addr := serveProbesForTest(t)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	conns := make([]net.Conn, ProbeMaxConns)
	for i := range conns {
		conns[i] = dial()
		conns[i].Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")) // held open, unfinished
	}
	// One more: accepted by the kernel, but not served while the cap
	// is reached.
	extra := dial()
	extra.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	extra.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := extra.Read(make([]byte, 1)); n > 0 || err == nil {
		t.Fatalf("connection %d was served while %d were held open", ProbeMaxConns+1, ProbeMaxConns)
	}
	for _, c := range conns {
		c.Close()
	}
	// Once they close, it is.
	extra.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(extra), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("after the held connections closed: %v %v, want 200", res, err)
	}
}
