package kgohooks

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/notify"
)

// A dial on the network when the gate shuts is canceled and waited for, so
// not even a half-open socket is left at the dump; it is dialed again when
// the gate opens.
func TestDialGateCutCancelsDialInFlight(t *testing.T) {
	started := make(chan struct{}, 4)
	var attempts int
	g := newDialGate(func(ctx context.Context, network, host string) (net.Conn, error) {
		attempts++
		if attempts == 1 {
			started <- struct{}{}
			<-ctx.Done() // a broker that does not answer
			return nil, ctx.Err()
		}
		c1, c2 := net.Pipe()
		go func() { <-ctx.Done(); c2.Close() }()
		return c1, nil
	})
	done := make(chan error, 1)
	go func() {
		c, err := g.Dial(context.Background(), "tcp", "broker:9092")
		if err == nil && c != nil {
			defer c.Close()
		}
		done <- err
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := g.cut(ctx); err != nil {
		t.Fatalf("cut: %v", err)
	}
	if n := g.openConns(); n != 0 {
		t.Errorf("%d connections open after the cut", n)
	}
	select {
	case err := <-done:
		t.Fatalf("the dial canceled by the cut returned %v; it should wait for the gate", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.open()
	if err := <-done; err != nil {
		t.Errorf("dial after the gate opened: %v", err)
	}
	g.retire()
	if _, err := g.Dial(context.Background(), "tcp", "broker:9092"); err != errRetired {
		t.Errorf("dial of a retired client = %v, want errRetired", err)
	}
}

// kgo refuses a Dialer beside DialTLSConfig; the Client dials through its
// own gate and so must take the TLS options apart, not fail.
func TestNewAcceptsDialTLS(t *testing.T) {
	c, err := New([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.DialTLS()}, WithRegistry(notify.NewRegistry()))
	if err != nil {
		t.Fatalf("New with kgo.DialTLS: %v", err)
	}
	c.Close()
}
