package appkit

import (
	"net"
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
