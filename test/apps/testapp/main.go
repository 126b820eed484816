// Command testapp is the target program of kcr's end-to-end tests. It keeps
// in-memory state (a counter a goroutine advances), a listening TCP socket
// that reports that state, and an outbound TCP connection that a registered
// hook closes before a checkpoint and reopens after it. It writes one JSON
// line per event to stdout, which the tests read.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/proto"
)

var out = json.NewEncoder(os.Stdout)
var outMu sync.Mutex

func emit(ev string, kv ...any) {
	m := map[string]any{"ev": ev, "pid": os.Getpid(), "t": time.Now().UnixNano()}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	outMu.Lock()
	out.Encode(m)
	outMu.Unlock()
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address of the state listener")
	echo := flag.String("echo", "", "address of an echo server to keep a connection to")
	failHook := flag.String("fail-hook", "", "name of a resource whose before-checkpoint hook fails")
	unhooked := flag.String("unhooked", "", "address to keep an extra connection to that no hook closes")
	mptcp := flag.Bool("mptcp", false, "listen with MPTCP")
	dial := flag.String("dial", "", "connect to this control socket, send hello, print the answer and exit")
	heapMB := flag.Int("heap-mb", 0, "keep this many MiB of filled memory (warm state for benchmarks)")
	listenFDs := flag.Bool("listen-fds", false, "serve the state on the socket of LISTEN_FDS (kcr standby --listen) instead of -listen; every connection counts as activity (notify.Touch)")
	startDelay := flag.Duration("start-delay", 0, "wait this long before opening the control socket (a slow cold start)")
	afterDelay := flag.Duration("after-delay", 0, "an after-restore hook that takes this long (a slow restore)")
	beforeDelay := flag.Duration("before-delay", 0, "a before-checkpoint hook that takes this long (a slow checkpoint)")
	logRate := flag.Int("log-rate", 0, "write this many numbered lines a second (\"logline N ...\"): nine in ten to stdout, one in ten to stderr, one in a thousand 8 KiB long (above PIPE_BUF, so more than one write)")
	lateHook := flag.Duration("late-hook", 0, "an after-restore hook registered after the listeners that takes this long; each answer then ends with late=N, the generation it last ran for")
	flag.Parse()
	if *dial != "" {
		os.Exit(dialMode(*dial))
	}

	heap := make([]byte, *heapMB<<20)
	for i := range heap {
		heap[i] = byte(i * 7)
	}
	defer func() { _ = heap[len(heap)/2:] }()

	var counter atomic.Int64
	var conn struct {
		sync.Mutex
		c     net.Conn
		dials int
	}
	connect := func() error {
		if *echo == "" {
			return nil
		}
		c, err := net.DialTimeout("tcp", *echo, 5*time.Second)
		if err != nil {
			return err
		}
		conn.Lock()
		conn.c = c
		conn.dials++
		n := conn.dials
		conn.Unlock()
		emit("connected", "dials", n)
		return nil
	}
	if err := connect(); err != nil {
		emit("fatal", "err", err.Error())
		os.Exit(1)
	}

	hook := func(name string, before func() error, after func(notify.Event) error) {
		notify.Register(name, notify.Func(
			func(ctx context.Context) error {
				emit("before", "name", name)
				if name == *failHook {
					return errors.New("refusing on purpose")
				}
				if before != nil {
					return before()
				}
				return nil
			},
			func(ctx context.Context, ev notify.Event) error {
				emit("after", "name", name, "kind", ev.Kind.String(), "gen", ev.Generation, "instance", ev.InstanceID,
					"reason", ev.Reason, "self", ev.SelfDetected)
				if after != nil {
					return after(ev)
				}
				return nil
			}))
	}
	hook("state", nil, nil)
	hook("conn", func() error {
		conn.Lock()
		defer conn.Unlock()
		if conn.c != nil {
			conn.c.Close()
			conn.c = nil
		}
		return nil
	}, func(notify.Event) error { return connect() })
	hook("worker", nil, nil)
	if *afterDelay > 0 || *beforeDelay > 0 {
		hook("slow", func() error {
			time.Sleep(*beforeDelay)
			return nil
		}, func(notify.Event) error {
			time.Sleep(*afterDelay)
			emit("slow-done")
			return nil
		})
	}

	if *unhooked != "" {
		c, err := net.Dial("tcp", *unhooked)
		if err != nil {
			emit("fatal", "err", err.Error())
			os.Exit(1)
		}
		defer c.Close()
	}

	var lc net.ListenConfig
	lc.SetMultipathTCP(*mptcp)
	var ln net.Listener
	var err error
	if *listenFDs {
		var lns []net.Listener
		lns, err = notify.Listeners()
		if err == nil && len(lns) != 1 {
			err = fmt.Errorf("%d sockets in LISTEN_FDS, want 1", len(lns))
		}
		if err == nil {
			ln = lns[0]
		}
	} else {
		ln, err = lc.Listen(context.Background(), "tcp", *listen)
	}
	if err != nil {
		emit("fatal", "err", err.Error())
		os.Exit(1)
	}
	var late atomic.Uint64
	if *lateHook > 0 {
		// After Listeners, as the docs recommend for the app's own hooks.
		notify.Register("late", notify.Func(nil, func(_ context.Context, ev notify.Event) error {
			time.Sleep(*lateHook)
			late.Store(ev.Generation)
			return nil
		}))
	}
	time.Sleep(*startDelay)
	srv, err := notify.Start()
	if err != nil {
		emit("fatal", "err", err.Error())
		os.Exit(1)
	}
	defer srv.Close()

	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			gen, id := notify.Identity()
			if *lateHook > 0 {
				fmt.Fprintf(c, "%d %d %s late=%d\n", counter.Load(), gen, id, late.Load())
			} else {
				fmt.Fprintf(c, "%d %d %s\n", counter.Load(), gen, id)
			}
			c.Close()
			if *listenFDs {
				notify.Touch()
			}
		}
	}()

	// The worker advances the state and uses the outbound connection.
	go func() {
		buf := make([]byte, 5)
		for i := 0; ; i++ {
			time.Sleep(10 * time.Millisecond)
			counter.Add(1)
			if i%10 != 0 {
				continue
			}
			conn.Lock()
			if c := conn.c; c != nil {
				c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Write([]byte("ping\n")); err == nil {
					_, err = c.Read(buf)
				}
			}
			conn.Unlock()
		}
	}()

	if *logRate > 0 {
		go logLines(*logRate)
	}
	emit("ready", "listen", ln.Addr().String(), "socket", srv.Path())
	sig := make(chan os.Signal, 1)
	signalNotify(sig)
	<-sig
	emit("exit")
}

func dialMode(path string) int {
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Println("dial error:", err)
		if errors.Is(err, syscall.EACCES) {
			return 3
		}
		return 2
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := proto.Write(c, proto.Message{Type: proto.TypeHello}); err != nil {
		fmt.Println("write error:", err)
		return 2
	}
	m, err := proto.Read(bufio.NewReader(c))
	if err != nil {
		fmt.Println("read error:", err)
		return 2
	}
	fmt.Println(m.Type, strings.TrimSpace(m.Error))
	if m.Type == proto.TypeError {
		return 4
	}
	return 0
}

// logLines writes rate numbered lines a second, forever, each with one
// write(2) but the long ones: "logline N out|err PADDING", N from 0 and
// the same sequence across both streams.
func logLines(rate int) {
	pad := strings.Repeat("x", 80)
	long := strings.Repeat("y", 8<<10)
	const batch = 10 // lines per tick: a 1 ms ticker at 10,000 lines/s
	tick := time.NewTicker(time.Second * batch / time.Duration(rate))
	defer tick.Stop()
	for n := 0; ; {
		<-tick.C
		for range batch {
			w, name, p := os.Stdout, "out", pad
			if n%10 == 9 {
				w, name = os.Stderr, "err"
			}
			if n%1000 == 999 {
				p = long
			}
			line := fmt.Sprintf("logline %d %s %s\n", n, name, p)
			if w == os.Stdout {
				outMu.Lock() // not between the bytes of an event
			}
			w.WriteString(line)
			if w == os.Stdout {
				outMu.Unlock()
			}
			n++
		}
	}
}
