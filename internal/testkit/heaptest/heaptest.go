// Package heaptest drives test/apps/lazyheap, the test service of lazy
// restore, for the criu and end-to-end tests and the lazy benchmark: it
// starts one and asks it for its heap's checksum.
package heaptest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Heap is a running lazyheap.
type Heap struct {
	PID  int
	Addr string // its TCP listener
	Out  string // its output file
}

// Start runs bin (a built lazyheap) detached (setsid, stdin /dev/null,
// output appended to dir/out.log, GODEBUG=multipathtcp=0) with a heap of mb
// MiB stamped from seed, and returns once the heap is filled and it listens.
// Stopping it is the caller's.
func Start(ctx context.Context, bin, dir string, mb int, seed uint64) (*Heap, error) {
	h := &Heap{Out: filepath.Join(dir, "out.log")}
	cmd := exec.CommandContext(ctx, bin, "-daemon", "-out", h.Out, "-portfile", filepath.Join(dir, "port"),
		"-mb", strconv.Itoa(mb), "-seed", strconv.FormatUint(seed, 10))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GODEBUG=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, "GODEBUG=multipathtcp=0")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	if _, err := fmt.Sscanf(string(out), "%d %s", &h.PID, &h.Addr); err != nil {
		return nil, fmt.Errorf("%s printed %q", bin, out)
	}
	return h, nil
}

// Ask sends cmd ("ping", "sum") and returns the one-line answer.
func (h *Heap) Ask(ctx context.Context, cmd string) (string, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := new(net.Dialer).DialContext(dctx, "tcp", h.Addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })()
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // a sum of a lazily restored heap faults in every page
	fmt.Fprintf(c, "%s\n", cmd)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("%s %s: %q: %w", cmd, h.Addr, line, err)
	}
	return strings.TrimSpace(line), nil
}

// Sum asks for the heap's checksum, its size in pages and how long the
// pass over it took inside the process; it fails unless every page is as
// the seed dictates.
func (h *Heap) Sum(ctx context.Context) (sum string, pages int, took time.Duration, err error) {
	line, err := h.Ask(ctx, "sum")
	if err != nil {
		return "", 0, 0, err
	}
	var bad, ms int
	if _, err := fmt.Sscanf(line, "sum %s pages %d bad %d ms %d", &sum, &pages, &bad, &ms); err != nil {
		return "", 0, 0, fmt.Errorf("sum: %q", line)
	}
	if bad != 0 {
		return "", 0, 0, fmt.Errorf("%d of %d heap pages are wrong: %s", bad, pages, line)
	}
	return sum, pages, time.Duration(ms) * time.Millisecond, nil
}
