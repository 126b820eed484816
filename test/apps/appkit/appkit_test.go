package appkit

import (
	"net"
	"runtime"
	"slices"
	"testing"
)

// SocketsTo sees a connection this process holds to a port, and no longer
// once it is closed.
func TestSocketsTo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ports := Ports([]string{ln.Addr().String()})
	if len(ports) != 1 {
		t.Fatalf("Ports(%s) = %v", ln.Addr(), ports)
	}
	if n := SocketsTo(ports); n != 0 {
		t.Fatalf("%d sockets to a port nobody dialed", n)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if n := SocketsTo(ports); n != 1 {
		t.Errorf("%d sockets to the port with one connection open, want 1", n)
	}
	c.Close()
	if n := SocketsTo(ports); n != 0 {
		t.Errorf("%d sockets to the port after closing the connection, want 0", n)
	}
}

func TestPending(t *testing.T) {
	var p Pending
	p.Add(5, 1, 2, 3)
	p.Add(7)
	p.Done(2, 9)
	if got, want := p.Runs(), [][2]int{{1, 1}, {3, 3}, {5, 5}, {7, 7}}; !slices.Equal(got, want) {
		t.Errorf("Runs() = %v, want %v", got, want)
	}
	if p.Len() != 4 {
		t.Errorf("Len() = %d, want 4", p.Len())
	}
}

// A record numbered while the last before-checkpoint hook holds the set
// takes its mark and identity only after Release: what Hold reported is
// all an image holds under the checkpointed identity.
func TestPendingHold(t *testing.T) {
	var p Pending
	p.Start(1)
	if got := p.Hold(); !slices.Equal(got, [][2]int{{1, 1}}) {
		t.Fatalf("Hold = %v, want [[1 1]]", got)
	}
	started := make(chan struct{})
	go func() {
		p.Start(2)
		close(started)
	}()
	// Start(2) waits: nothing it does can be seen until Release.
	for range 100 {
		runtime.Gosched()
	}
	select {
	case <-started:
		t.Fatal("Start returned while the set was held")
	default:
	}
	if got := p.Runs(); !slices.Equal(got, [][2]int{{1, 1}}) {
		t.Fatalf("pending %v while held, want [[1 1]]", got)
	}
	p.Release()
	<-started
	if got := p.Runs(); !slices.Equal(got, [][2]int{{1, 2}}) {
		t.Fatalf("pending %v after Release, want [[1 2]]", got)
	}
	p.Release() // without Hold: nothing to do
}
