package kafkawake

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// A broker that comes up a moment after kcr standby starts (both started by
// one unit, or a slow TLS handshake) is waited for within BrokerTimeout,
// not refused at the first failed request.
func TestNewWaitsForLateBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	started := make(chan *kfake.Cluster, 1)
	go func() {
		time.Sleep(700 * time.Millisecond)
		c, err := kfake.NewCluster(kfake.Ports(port))
		if err != nil {
			t.Error(err)
		}
		started <- c
	}()
	defer func() {
		if c := <-started; c != nil {
			c.Close()
		}
	}()
	w, err := New(context.Background(), Config{
		Brokers: []string{"127.0.0.1:" + strconv.Itoa(port)}, Group: "g",
		BrokerTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("a broker up 0.7 s after the start: %v", err)
	}
	w.Close()
}
