// Command lazyheap is a test service for lazy (userfaultfd) restore: it
// allocates a heap of -mb MiB, stamps every 4 KiB page with its index, the
// seed and a pattern derived from both, and answers on a TCP listener:
//
//	"ping" -> "pong <pid>"                               (touches little memory)
//	"sum"  -> "sum <hex> pages <n> bad <n> ms <n>"       (reads the whole heap)
//
// bad counts pages whose content differs from what the seed dictates (a
// page restored as zeros, say). sum is a checksum of the whole heap.
//
// With -notify it opens kcr's control socket, so that kcr standby can run
// it; each request counts as activity.
//
// With -daemon it starts a detached copy of itself (setsid, stdin
// /dev/null, output appended to -out), waits until that copy has filled its
// heap and listens, and prints the copy's PID and address.
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/test/apps/svckit"
)

const pageSize = 4096

// heap is global so that it stays reachable; it has no pointers, so the
// garbage collector never reads it.
var heap []byte

func main() {
	daemon := flag.Bool("daemon", false, "start a detached copy, wait until it listens, print \"<pid> <addr>\", exit")
	out := flag.String("out", "", "output file for -daemon (opened O_APPEND)")
	mb := flag.Int("mb", 256, "heap size in MiB")
	seed := flag.Uint64("seed", 1, "pattern seed")
	listen := flag.String("listen", "127.0.0.1:0", "TCP address to listen on")
	portFile := flag.String("portfile", "", "write the listening address here once the heap is filled")
	withNotify := flag.Bool("notify", false, "open kcr's control socket (for kcr standby); each request counts as activity")
	flag.Parse()

	if *daemon {
		startDaemon(*out, *portFile)
		return
	}

	start := time.Now()
	heap = make([]byte, *mb<<20)
	for p := 0; p < len(heap)/pageSize; p++ {
		fill(heap[p*pageSize:(p+1)*pageSize], uint64(p), *seed)
	}
	fmt.Printf("filled %d MiB in %v\n", *mb, time.Since(start))

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fatal(err)
	}
	if *portFile != "" {
		if err := svckit.WriteAddr(*portFile, ln.Addr().String()); err != nil {
			fatal(err)
		}
	}
	if *withNotify {
		srv, err := notify.Start()
		if err != nil {
			fatal(err)
		}
		defer srv.Close()
	}
	fmt.Printf("ready pid %d addr %s\n", os.Getpid(), ln.Addr())
	var mu sync.Mutex // one checksum at a time
	svckit.Serve(ln, func(c net.Conn) {
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Minute))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			notify.Default.Touch(1)
			switch strings.TrimSpace(line) {
			case "ping":
				fmt.Fprintf(c, "pong %d\n", os.Getpid())
			case "sum":
				mu.Lock()
				t := time.Now()
				sum, bad := check(*seed)
				ms := time.Since(t).Milliseconds()
				mu.Unlock()
				fmt.Fprintf(c, "sum %016x pages %d bad %d ms %d\n", sum, len(heap)/pageSize, bad, ms)
			default:
				fmt.Fprintf(c, "error unknown command %q\n", strings.TrimSpace(line))
			}
		}()
	})
}

// word returns the pattern's i-th 8-byte word of page p (splitmix64).
func word(p, seed uint64, i int) uint64 {
	z := seed*0x9e3779b97f4a7c15 + p<<9 + uint64(i)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// fill stamps page p: word 0 is its index, word 1 the seed, the rest the
// pattern.
func fill(b []byte, p, seed uint64) {
	binary.LittleEndian.PutUint64(b[0:], p)
	binary.LittleEndian.PutUint64(b[8:], seed)
	for i := 2; i < pageSize/8; i++ {
		binary.LittleEndian.PutUint64(b[i*8:], word(p, seed, i))
	}
}

// check reads every word of the heap: it returns a checksum of the heap and
// the number of pages that differ from the pattern.
func check(seed uint64) (sum uint64, bad int) {
	sum = 0xcbf29ce484222325
	for p := 0; p < len(heap)/pageSize; p++ {
		b := heap[p*pageSize : (p+1)*pageSize]
		ok := binary.LittleEndian.Uint64(b[0:]) == uint64(p) && binary.LittleEndian.Uint64(b[8:]) == seed
		for i := 0; i < pageSize/8; i++ {
			w := binary.LittleEndian.Uint64(b[i*8:])
			sum = (sum ^ w) * 0x100000001b3
			if i >= 2 && w != word(uint64(p), seed, i) {
				ok = false
			}
		}
		if !ok {
			bad++
		}
	}
	return sum, bad
}

func startDaemon(out, portFile string) {
	if portFile == "" {
		fatal(fmt.Errorf("-daemon needs -portfile"))
	}
	os.Remove(portFile)
	cmd, err := svckit.Detach(out)
	if err != nil {
		fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(portFile); err == nil {
			fmt.Println(cmd.Process.Pid, string(b))
			return
		}
		select {
		case err := <-exited:
			fatal(fmt.Errorf("service exited before listening: %v (output in %s)", err, out))
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			fatal(fmt.Errorf("service did not listen within 2m (output in %s)", out))
		}
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "lazyheap:", err)
	os.Exit(1)
}
