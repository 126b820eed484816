package kafkahooks

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/internal/testkit/tlstest"
	"github.com/kcr-dev/kcr/notify"
)

// request frames a Kafka request of API key key with a body of n bytes.
func request(key int16, n int) []byte {
	b := make([]byte, 6+n)
	binary.BigEndian.PutUint32(b, uint32(2+n))
	binary.BigEndian.PutUint16(b[4:], uint16(key))
	return b
}

// TestSnoopConnFraming: a connection is marked a fetcher only by a Fetch
// request, wherever the writes split the frames, and never by the bytes of
// another request's body.
func TestSnoopConnFraming(t *testing.T) {
	body := request(3, 40) // Metadata
	body[10] = 0           // a body that contains the bytes of a Fetch header
	binary.BigEndian.PutUint32(body[12:], 2)
	binary.BigEndian.PutUint16(body[16:], fetchAPIKey)
	stream := append(append(append([]byte{}, request(18, 0)...), body...), request(8, 7)...)
	for _, tc := range []struct {
		name  string
		extra []byte
		fetch bool
	}{
		{"other requests", nil, false},
		{"then a fetch", request(fetchAPIKey, 30), true},
	} {
		all := append(append([]byte{}, stream...), tc.extra...)
		for split := 1; split <= len(all); split++ {
			c := &snoopConn{f: newFetchCut()}
			for p := all; len(p) > 0; {
				n := min(split, len(p))
				c.scan(p[:n])
				p = p[n:]
			}
			if c.fetcher.Load() != tc.fetch {
				t.Fatalf("%s, writes of %d bytes: fetcher %v, want %v", tc.name, split, c.fetcher.Load(), tc.fetch)
			}
			if c.nhdr != 0 || c.rem != 0 {
				t.Fatalf("%s, writes of %d bytes: framing ends at header byte %d, %d bytes left", tc.name, split, c.nhdr, c.rem)
			}
		}
	}
}

// TestFetchCutRefusesLaterFetches: once cut, a connection that carried a
// Fetch is closed, and a Fetch written on any connection of the generation
// fails without reaching the broker; other requests pass.
func TestFetchCutRefusesLaterFetches(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	f := newFetchCut()
	dial := f.wrap((&net.Dialer{}).DialContext, nil)
	ctx := context.Background()
	fetcher, err := dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	coord, err := dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fetcher.Write(request(fetchAPIKey, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := coord.Write(request(12, 10)); err != nil { // Heartbeat
		t.Fatal(err)
	}
	if n := f.cutFetches(); n != 1 {
		t.Fatalf("cut %d connections, want 1 (the fetcher)", n)
	}
	if _, err := fetcher.Write(request(12, 10)); err == nil {
		t.Error("the cut fetch connection still writes")
	}
	if _, err := coord.Write(request(13, 10)); err != nil { // LeaveGroup
		t.Errorf("the coordinator's connection: %v", err)
	}
	if _, err := coord.Write(request(fetchAPIKey, 10)); err != errFetchCut {
		t.Errorf("a Fetch after the cut: %v, want errFetchCut", err)
	}
}

// TestReaderProdIdleCheckpoint: an idle Reader with kafka-go's default
// MaxWait (10 s) checkpoints without waiting out the fetch it has in flight,
// and after the restore every record is handed exactly once: those
// consumed before, those written while it was down, and those after.
func TestReaderProdIdleCheckpoint(t *testing.T) {
	addrs := prodBrokers(t)
	for _, group := range []bool{true, false} {
		t.Run("group="+strconv.FormatBool(group), func(t *testing.T) {
			const n = 20
			parts := int32(2)
			if !group {
				parts = 1
			}
			topic, _ := prodTopic(t, addrs, parts, n)
			log, _ := newLog(t)
			reg := notify.NewRegistry()
			// Registered first: its before hook runs after the reader's.
			hook(reg, func(context.Context) error {
				return writeValues(addrs, topic, n, n+5)
			}, nil)
			cfg := kafka.ReaderConfig{Brokers: addrs, Topic: topic, StartOffset: kafka.FirstOffset}
			if group {
				cfg.GroupID = topic + "-g"
			}
			r := NewReader(cfg, WithRegistry(reg), WithLogger(log))
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			seen := map[string]int{}
			consume := func(upTo int) {
				t.Helper()
				for len(seen) < upTo {
					m, err := r.FetchMessage(ctx)
					if err != nil {
						t.Fatalf("with %d of %d records: %v", len(seen), upTo, err)
					}
					seen[string(m.Value)]++
					if group {
						if err := r.CommitMessages(ctx, m); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			consume(n)
			// Every partition's reader now waits in a fetch of up to
			// 10 s for records that do not come.
			res := hooktest.SimulateOK(t, ctx, reg, notify.SimRestore, 30*time.Second)
			rep := decodeReport[ReaderReport](t, res.Before[0].Details)
			t.Logf("idle checkpoint: %d ms, %d connections closed", rep.DurationMS, rep.ConnectionsClosed)
			if rep.ReaderCheckpoint == nil || !rep.ClosedCleanly {
				t.Fatalf("report %+v: want the reader closed cleanly", rep.ReaderCheckpoint)
			}
			if group && !rep.LeftGroup {
				t.Errorf("report %+v: want the group left", rep.GroupCheckpoint)
			}
			// The fetch waits 10 s; a checkpoint that waits it out takes
			// most of that, one that cuts it a fraction.
			if rep.DurationMS >= 5000 {
				t.Errorf("the idle reader took %d ms to checkpoint: it waited out its fetch (MaxWait 10 s)", rep.DurationMS)
			}
			if err := writeValues(addrs, topic, n+5, n+10); err != nil {
				t.Fatal(err)
			}
			consume(n + 10)
			for i := range n + 10 {
				if c := seen[strconv.Itoa(i)]; c != 1 {
					t.Errorf("record %d handed %d times", i, c)
				}
			}
		})
	}
}

// writeValues writes the values from..to-1 to topic.
func writeValues(addrs []string, topic string, from, to int) error {
	tr := &kafka.Transport{} // not kafka-go's shared one, which caches metadata
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addrs...), Topic: topic, BatchTimeout: time.Millisecond, Transport: tr}
	defer w.Close()
	var msgs []kafka.Message
	for i := from; i < to; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte(strconv.Itoa(i))})
	}
	return w.WriteMessages(context.Background(), msgs...)
}

// TestFetchCutTLS: with a TLS config the handshake happens below the
// watch, which then sees the requests in the clear, and the server name
// defaults to the address's host, as kafka-go's Dialer does it.
func TestFetchCutTLS(t *testing.T) {
	server, pool := tlstest.SelfSigned(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 16)
		n, _ := io.ReadFull(c, b)
		got <- b[:n]
	}()
	f := newFetchCut()
	c, err := f.wrap((&net.Dialer{}).DialContext, &tls.Config{RootCAs: pool})(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("TLS dial, server name from the address: %v", err)
	}
	defer c.Close()
	req := request(fetchAPIKey, 10)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, req) {
		t.Fatalf("the server read %x, want %x", b, req)
	}
	if n := f.cutFetches(); n != 1 {
		t.Fatalf("cut %d connections, want the TLS fetch connection", n)
	}
}
