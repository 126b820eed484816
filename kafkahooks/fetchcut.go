package kafkahooks

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// errFetchCut fails a Fetch request written after a checkpoint cut the
// fetches of its kafka.Reader generation.
var errFetchCut = errors.New("kafka fetch cut for a checkpoint")

// fetchAPIKey is the Kafka protocol's API key of Fetch requests.
const fetchAPIKey = 1

// fetchCut finds the connections of one kafka.Reader generation that carry
// Fetch requests, so that a checkpoint can cut the fetch kafka-go is
// waiting on: kafka-go's Close waits for it, up to MaxWait (10 s by
// default), and a record it brings is never handed out anyway. The group
// coordinator's connection, which Close still needs to commit and leave,
// carries no Fetch and stays open.
type fetchCut struct {
	cut   atomic.Bool
	mu    sync.Mutex
	conns map[*snoopConn]struct{}
}

func newFetchCut() *fetchCut { return &fetchCut{conns: map[*snoopConn]struct{}{}} }

// wrap returns dial with its connections watched. With a TLS config the
// handshake happens here, below the watch, so that the watch reads the
// requests in the clear; kafka-go must then be given no TLS config.
func (f *fetchCut) wrap(dial func(context.Context, string, string) (net.Conn, error), cfg *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		if cfg != nil {
			if c, err = tlsClient(ctx, c, cfg, address); err != nil {
				return nil, err
			}
		}
		sc := &snoopConn{Conn: c, f: f}
		f.mu.Lock()
		f.conns[sc] = struct{}{}
		f.mu.Unlock()
		return sc, nil
	}
}

// tlsClient does what kafka-go's Dialer does with its TLS config: a client
// handshake, with the address's host as server name unless one is set.
func tlsClient(ctx context.Context, c net.Conn, cfg *tls.Config, address string) (net.Conn, error) {
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			host = address
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// cutFetches closes every connection that carried a Fetch and makes later
// Fetch requests of this generation fail. It returns how many it closed.
func (f *fetchCut) cutFetches() int {
	f.cut.Store(true)
	f.mu.Lock()
	var fetchers []*snoopConn
	for c := range f.conns {
		if c.fetcher.Load() {
			fetchers = append(fetchers, c)
		}
	}
	f.mu.Unlock()
	for _, c := range fetchers {
		c.Close()
	}
	return len(fetchers)
}

// snoopConn reads the request headers a connection writes: Kafka frames
// each request as a 4-byte size, then its 2-byte API key.
type snoopConn struct {
	net.Conn
	f       *fetchCut
	fetcher atomic.Bool // has written a Fetch request

	// Framing state; kafka-go writes a connection from one goroutine at a
	// time.
	hdr  [6]byte
	nhdr int
	rem  int64 // bytes of the current request not seen yet
}

func (c *snoopConn) Write(p []byte) (int, error) {
	if c.scan(p) && c.f.cut.Load() {
		c.Close()
		return 0, errFetchCut
	}
	return c.Conn.Write(p)
}

// scan follows the request framing through p and reports whether a Fetch
// request starts in it.
func (c *snoopConn) scan(p []byte) bool {
	fetch := false
	for len(p) > 0 {
		if c.rem > 0 {
			n := min(int64(len(p)), c.rem)
			c.rem -= n
			p = p[n:]
			continue
		}
		n := copy(c.hdr[c.nhdr:], p)
		c.nhdr += n
		p = p[n:]
		if c.nhdr < len(c.hdr) {
			break
		}
		c.nhdr = 0
		c.rem = int64(int32(binary.BigEndian.Uint32(c.hdr[:4]))) - 2
		if int16(binary.BigEndian.Uint16(c.hdr[4:])) == fetchAPIKey {
			c.fetcher.Store(true)
			fetch = true
		}
	}
	return fetch
}

func (c *snoopConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.conns, c)
	c.f.mu.Unlock()
	return c.Conn.Close()
}
