// Package appkit is what the Kafka test programs of kcr's end-to-end tests
// (kafkaapp, kgoapp) share: their JSON event log on stdout, the host PID
// that tells clones apart, and small helpers.
package appkit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

var (
	out   = json.NewEncoder(os.Stdout)
	outMu sync.Mutex
)

// Emit writes one event as a JSON line: ev, pid, hpid, t and the key/value
// pairs kv.
func Emit(ev string, kv ...any) {
	m := map[string]any{"ev": ev, "pid": os.Getpid(), "hpid": HostPID(), "t": time.Now().UnixNano()}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	outMu.Lock()
	out.Encode(m)
	outMu.Unlock()
}

// HostPID returns the PID of this process in the host's PID namespace: kcr
// run gives no mount namespace, so /proc is the host's procfs. It is read
// each time: a restored clone has a new one.
func HostPID() int {
	s, err := os.Readlink("/proc/self")
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// SetLogger makes slog log JSON events "log" at level, with the host PID of
// the moment in every record.
func SetLogger(level string) error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return err
	}
	slog.SetDefault(slog.New(hpidHandler{slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: lvl})}).With("ev", "log", "pid", os.Getpid()))
	return nil
}

// hpidHandler adds the host PID of the moment to every slog record.
type hpidHandler struct{ slog.Handler }

func (h hpidHandler) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(slog.Int("hpid", HostPID()))
	return h.Handler.Handle(ctx, r)
}

func (h hpidHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return hpidHandler{h.Handler.WithAttrs(as)}
}
func (h hpidHandler) WithGroup(name string) slog.Handler {
	return hpidHandler{h.Handler.WithGroup(name)}
}

// OpenFDs counts the open file descriptors, less the one reading them.
func OpenFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1
}

// Runs turns numbers into sorted [first, last] runs of consecutive ones.
func Runs(b []int) [][2]int {
	if len(b) == 0 {
		return nil
	}
	s := slices.Clone(b)
	slices.Sort(s)
	s = slices.Compact(s)
	var out [][2]int
	start, prev := s[0], s[0]
	for _, n := range s[1:] {
		if n != prev+1 {
			out = append(out, [2]int{start, prev})
			start = n
		}
		prev = n
	}
	return append(out, [2]int{start, prev})
}

// ErrString is err's message, or "".
func ErrString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// SocketsTo counts this process's TCP sockets whose remote port is one of
// ports, from the kernel's tables (/proc/self/net/tcp and tcp6, matched to
// the process's fds by inode), not from any client's own count: -1 if they
// cannot be read.
func SocketsTo(ports []int) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	inodes := map[string]bool{}
	for _, e := range fds {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if ino, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[2], ":")
			p, err := strconv.ParseInt(hexPort, 16, 32)
			if err == nil && slices.Contains(ports, int(p)) {
				n++
			}
		}
	}
	return n
}

// Ports returns the ports of host:port addresses (the brokers).
func Ports(addrs []string) []int {
	var ps []int
	for _, a := range addrs {
		if i := strings.LastIndexByte(a, ':'); i >= 0 {
			if p, err := strconv.Atoi(a[i+1:]); err == nil {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// Fatal emits a "fatal" event with msg and exits with code.
func Fatal(code int, msg string) {
	Emit("fatal", "err", msg)
	os.Exit(code)
}

// EmitAfter emits the "after" event of an after-restore hook: the event's
// kind, generation, instance id and reason, and the pairs kv (client ids).
func EmitAfter(ev notify.Event, kv ...any) {
	Emit("after", append([]any{"kind", ev.Kind.String(), "gen", ev.Generation, "instance", ev.InstanceID, "reason", ev.Reason}, kv...)...)
}

// Pending is the set of record numbers handed to a client and not yet
// acknowledged.
//
// A program that numbers records takes their identity and marks them
// with Start, reports them from its last before-checkpoint hook with Hold,
// and calls Release from its last after-restore hook. Between Hold and
// Release, Start waits: a record whose identity was taken after the hook
// reported what was pending (the program runs on until CRIU freezes it)
// would be sent by every copy of the image under the checkpointed
// process's identity, and reported by none.
type Pending struct {
	mu   sync.Mutex
	m    map[int]struct{}
	hold chan struct{} // non-nil from Hold to Release; closed by Release
}

// Start waits while the set is held (Hold), then marks the numbers b
// pending and returns the identity to write them under: the instance id
// and the host PID of the moment, taken with the mark.
func (p *Pending) Start(b ...int) (inst string, hpid int) {
	p.mu.Lock()
	for p.hold != nil {
		h := p.hold
		p.mu.Unlock()
		<-h
		p.mu.Lock()
	}
	_, inst = notify.Identity()
	hpid = HostPID()
	p.addLocked(b)
	p.mu.Unlock()
	return inst, hpid
}

// Hold returns the pending numbers as runs (see Runs), and makes Start
// wait until Release.
func (p *Pending) Hold() [][2]int {
	p.mu.Lock()
	if p.hold == nil {
		p.hold = make(chan struct{})
	}
	p.mu.Unlock()
	return p.Runs()
}

// Release lets Start go on.
func (p *Pending) Release() {
	p.mu.Lock()
	if p.hold != nil {
		close(p.hold)
		p.hold = nil
	}
	p.mu.Unlock()
}

// Add records the numbers b as pending (records whose identity is
// already set; see Start).
func (p *Pending) Add(b ...int) {
	p.mu.Lock()
	p.addLocked(b)
	p.mu.Unlock()
}

func (p *Pending) addLocked(b []int) {
	if p.m == nil {
		p.m = map[int]struct{}{}
	}
	for _, n := range b {
		p.m[n] = struct{}{}
	}
}

// Done removes the numbers b.
func (p *Pending) Done(b ...int) {
	p.mu.Lock()
	for _, n := range b {
		delete(p.m, n)
	}
	p.mu.Unlock()
}

// Len is how many numbers are pending.
func (p *Pending) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// Runs returns the pending numbers as runs (see Runs).
func (p *Pending) Runs() [][2]int {
	p.mu.Lock()
	b := make([]int, 0, len(p.m))
	for n := range p.m {
		b = append(b, n)
	}
	p.mu.Unlock()
	return Runs(b)
}

// Pace calls next about rate times a second until ctx ends or next returns
// false. Ticks missed while the process was stopped or checkpointed are not
// made up for.
func Pace(ctx context.Context, rate int, next func() bool) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	credit := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			credit += float64(rate) * min(now.Sub(last), 50*time.Millisecond).Seconds()
			last = now
		}
		for ; credit >= 1; credit-- {
			if !next() {
				return
			}
		}
	}
}

// HandedListener returns the one socket of LISTEN_FDS (kcr standby
// --listen), on which every accepted connection counts as activity
// (notify.Touch): a connection is work.
func HandedListener() (net.Listener, error) {
	lns, err := notify.Listeners()
	if err == nil && len(lns) != 1 {
		err = fmt.Errorf("%d sockets in LISTEN_FDS, want 1", len(lns))
	}
	if err != nil {
		return nil, err
	}
	return touchListener{lns[0]}, nil
}

// touchListener counts every accepted connection as activity.
type touchListener struct{ net.Listener }

func (l touchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		notify.Touch()
	}
	return c, err
}

// ServeState answers every connection on ln with one JSON line: goroutine
// and open fd counts, the identity, and what state returns.
func ServeState(ln net.Listener, state func() map[string]any) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		gen, id := notify.Identity()
		m := state()
		m["goroutines"], m["fds"], m["gen"], m["instance"] = runtime.NumGoroutine(), OpenFDs(), gen, id
		b, _ := json.Marshal(m)
		c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		c.Write(append(b, '\n'))
		c.Close()
	}
}
