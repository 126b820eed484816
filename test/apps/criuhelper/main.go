// Command helper is a tiny long-running service used by the criu package's
// integration tests: it ticks a counter on stdout and can hold a TCP
// listener, an established TCP connection or a connected Unix socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/kcr-dev/kcr/test/apps/svckit"
)

func main() {
	daemon := flag.Bool("daemon", false, "start a detached copy (setsid, stdin /dev/null, output appended to -out), print its PID, exit")
	out := flag.String("out", "", "output file for -daemon")
	listen := flag.String("listen", "", "TCP address to listen on; each connection gets \"pong <counter>\"")
	mptcp := flag.Bool("mptcp", false, "listen with MPTCP even if GODEBUG=multipathtcp=0 (without it, Go decides)")
	portFile := flag.String("portfile", "", "write the listening address here")
	dial := flag.String("dial", "", "TCP address to connect to and keep the connection open")
	unixPath := flag.String("unix", "", "Unix stream socket to connect to and keep open")
	flag.Parse()

	if *daemon {
		startDaemon(*out)
		return
	}

	var counter atomic.Int64
	if *listen != "" {
		var lc net.ListenConfig
		if *mptcp {
			lc.SetMultipathTCP(true)
		}
		ln, err := lc.Listen(context.Background(), "tcp", *listen)
		if err != nil {
			fatal(err)
		}
		if *portFile != "" {
			if err := svckit.WriteAddr(*portFile, ln.Addr().String()); err != nil {
				fatal(err)
			}
		}
		go svckit.Serve(ln, func(c net.Conn) {
			fmt.Fprintf(c, "pong %d\n", counter.Load())
			c.Close()
		})
	}
	if *dial != "" {
		c, err := net.Dial("tcp", *dial)
		if err != nil {
			fatal(err)
		}
		held = append(held, c)
	}
	if *unixPath != "" {
		c, err := net.Dial("unix", *unixPath)
		if err != nil {
			fatal(err)
		}
		held = append(held, c)
	}
	fmt.Printf("ready pid %d\n", os.Getpid())
	for {
		n := counter.Add(1)
		fmt.Printf("tick %d\n", n)
		time.Sleep(20 * time.Millisecond)
	}
}

// held keeps connections referenced (and open) for the life of the process.
var held []net.Conn

func startDaemon(out string) {
	cmd, err := svckit.Detach(out)
	if err != nil {
		fatal(err)
	}
	fmt.Println(cmd.Process.Pid)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "helper:", err)
	os.Exit(1)
}
