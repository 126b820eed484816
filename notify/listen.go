package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// listenFDsStart is the first fd handed over, as systemd's SD_LISTEN_FDS_START.
const listenFDsStart = 3

// ListenFDsSocketEnv names the supervisor's Unix socket that hands the
// listening sockets back after a checkpoint ("kcr standby" sets it).
const ListenFDsSocketEnv = "KCR_LISTEN_FDS_SOCKET"

// Listeners returns the listening sockets handed to this process by its
// supervisor with the systemd convention (LISTEN_FDS=N, fds 3 … 3+N-1,
// LISTEN_PID naming this process), as "kcr standby --listen" does. It
// returns none without LISTEN_FDS, and an error for a LISTEN_PID that names
// another process. It unsets the variables so that children do not take
// the sockets for theirs. Call it once, at start.
//
// The sockets stay the supervisor's: CRIU cannot restore a listening TCP
// socket that a process outside the image holds (it would bind a new one,
// and the address is taken). So, under kcr standby, the listeners take part
// in checkpoints (registered with the default registry as "listen-fds"):
// before a checkpoint they close this process's copies, and Accept waits;
// after the restore (or resume) they fetch the sockets again from the
// supervisor, with the connections that queued meanwhile (asking again
// every 500 ms while it does not answer: it may be restarting), and Accept
// goes on once every after-restore hook of the cycle ran (those registered
// after Listeners too), so that no handler runs in a copy whose hooks have
// not. Register the hooks that drain in-flight requests after calling
// Listeners, so that they run before the listeners close.
//
// Serve the listeners as usual and call Touch for every request handled,
// so that the supervisor sees the work.
func Listeners() ([]net.Listener, error) {
	n := os.Getenv("LISTEN_FDS")
	if n == "" {
		return nil, nil
	}
	sock := os.Getenv(ListenFDsSocketEnv)
	defer func() {
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDNAMES")
		os.Unsetenv(ListenFDsSocketEnv)
	}()
	if pid := os.Getenv("LISTEN_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return nil, fmt.Errorf("notify: LISTEN_PID=%s is not this process (%d): the sockets are another's", pid, os.Getpid())
	}
	count, err := strconv.Atoi(n)
	if err != nil || count < 0 || count > 64 {
		return nil, fmt.Errorf("notify: LISTEN_FDS=%q: want a small count", n)
	}
	files := make([]*os.File, count)
	for i := range files {
		files[i] = os.NewFile(uintptr(listenFDsStart+i), "LISTEN_FD_"+strconv.Itoa(listenFDsStart+i))
	}
	return handOver(Default, files, sock)
}

// handOver makes the listeners of files (closed here) and, with a
// supervisor socket, registers their checkpoint hooks with g.
func handOver(g *Registry, files []*os.File, sock string) ([]net.Listener, error) {
	lns := make([]net.Listener, len(files))
	hs := &handedSet{sock: sock}
	var errs []error
	for i, f := range files {
		ln, err := net.FileListener(f) // a dup
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("notify: fd %d of LISTEN_FDS: %w", listenFDsStart+i, err))
			continue
		}
		h := &handedListener{inner: ln, addr: ln.Addr()}
		h.cond = sync.NewCond(&h.mu)
		hs.lns = append(hs.lns, h)
		lns[i] = h
	}
	if err := errors.Join(errs...); err != nil {
		for _, h := range hs.lns {
			h.Close()
		}
		return nil, err
	}
	if sock != "" {
		g.Register("listen-fds", hs)
	}
	return lns, nil
}

// handedSet is the checkpoint resource of the handed-over listeners.
type handedSet struct {
	sock string
	lns  []*handedListener

	// mu orders a background fetch (see AfterRestore) with the next
	// checkpoint: epoch counts the checkpoints, and a fetch made for an
	// earlier one attaches nothing.
	mu    sync.Mutex
	epoch uint64
}

// fetchRetry is the pause between two fetches of the sockets from a
// supervisor that does not answer (it is being restarted).
var fetchRetry = 500 * time.Millisecond

// BeforeCheckpoint closes this process's copies of the sockets, once no
// Accept is inside them, so that the image holds none.
func (s *handedSet) BeforeCheckpoint(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	for _, h := range s.lns {
		if err := h.detach(ctx); err != nil {
			return err
		}
	}
	return nil
}

// AfterRestore fetches the sockets from the supervisor again. A supervisor
// that does not answer (killed, and restarted by its service manager) is
// asked again in the background until it does, while Accept waits: the
// sockets are its, and it is the only one that can hand them back.
func (s *handedSet) AfterRestore(ctx context.Context, ev Event) error {
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	s.hold(true)
	if s.fetch(ctx, epoch) == nil {
		return nil
	}
	go func() {
		for {
			time.Sleep(fetchRetry)
			if err := s.fetch(context.Background(), epoch); err == nil || errors.Is(err, errStale) {
				return
			}
		}
	}()
	return fmt.Errorf("notify: the listening sockets could not be fetched from %s yet; asking again every %v", s.sock, fetchRetry)
}

// AfterCycle lets Accept go on: every after-restore hook ran.
func (s *handedSet) AfterCycle() { s.hold(false) }

func (s *handedSet) hold(on bool) {
	for _, h := range s.lns {
		h.mu.Lock()
		h.held = on
		h.cond.Broadcast()
		h.mu.Unlock()
	}
}

func (s *handedSet) allClosed() bool {
	for _, h := range s.lns {
		h.mu.Lock()
		closed := h.closed
		h.mu.Unlock()
		if !closed {
			return false
		}
	}
	return true
}

// errStale is fetch's answer once a checkpoint came after the restore it
// fetched for, or every listener was closed.
var errStale = errors.New("stale fetch")

// fetch fetches the sockets for the restore after checkpoint epoch and
// attaches them, unless another checkpoint came meanwhile.
func (s *handedSet) fetch(ctx context.Context, epoch uint64) error {
	if s.allClosed() {
		return errStale
	}
	files, err := fetchFDs(ctx, s.sock, len(s.lns))
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch != epoch {
		for _, f := range files {
			f.Close()
		}
		return errStale
	}
	for i, h := range s.lns {
		ln, lerr := net.FileListener(files[i])
		files[i].Close()
		h.attach(ln, lerr)
	}
	return nil
}

// handedListener is a net.Listener whose socket is taken away during a
// checkpoint; Accept waits for it to come back.
type handedListener struct {
	addr net.Addr

	mu        sync.Mutex
	cond      *sync.Cond
	inner     net.Listener // nil while detached
	accepting int          // Accept calls inside inner
	err       error        // set when the socket could not be fetched back
	closed    bool
	// held keeps Accept waiting from the restore (or resume) until every
	// after-restore hook of the process ran (AfterCycle): a request is
	// never served by a copy whose own hooks registered after Listeners
	// (the recommended order) have not run yet.
	held bool
}

func (h *handedListener) Accept() (net.Conn, error) {
	h.mu.Lock()
	for {
		for (h.inner == nil || h.held) && !h.closed && h.err == nil {
			h.cond.Wait()
		}
		if h.closed {
			h.mu.Unlock()
			return nil, net.ErrClosed
		}
		if h.err != nil {
			err := h.err
			h.mu.Unlock()
			return nil, err
		}
		ln := h.inner
		h.accepting++
		h.mu.Unlock()
		c, err := ln.Accept()
		h.mu.Lock()
		h.accepting--
		h.cond.Broadcast()
		if err == nil {
			h.mu.Unlock()
			return c, nil
		}
		if h.inner == ln || h.closed {
			h.mu.Unlock()
			return nil, err
		}
		// Detached for a checkpoint: wait for the socket to come back.
	}
}

// detach closes the process's copy and waits until no Accept is inside it.
func (h *handedListener) detach(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inner != nil {
		h.inner.Close()
		h.inner = nil
	}
	stop := context.AfterFunc(ctx, func() {
		h.mu.Lock()
		h.cond.Broadcast()
		h.mu.Unlock()
	})
	defer stop()
	for h.accepting > 0 {
		if ctx.Err() != nil {
			return fmt.Errorf("notify: an Accept on a listening socket did not return: %w", ctx.Err())
		}
		h.cond.Wait()
	}
	return nil
}

func (h *handedListener) attach(ln net.Listener, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		if ln != nil {
			ln.Close()
		}
		return
	}
	h.inner, h.err = ln, err
	h.cond.Broadcast()
}

func (h *handedListener) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.cond.Broadcast()
	if h.inner != nil {
		return h.inner.Close()
	}
	return nil
}

func (h *handedListener) Addr() net.Addr { return h.addr }

// fetchFDs asks the supervisor's socket for the n listening sockets: one
// line "fds" out, one message with the fds (SCM_RIGHTS) back.
func fetchFDs(ctx context.Context, path string, n int) ([]*os.File, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	if _, err := uc.Write([]byte("fds\n")); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*n))
	_, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) != n {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("got %d sockets, want %d", len(fds), n)
	}
	files := make([]*os.File, n)
	for i, fd := range fds {
		unix.CloseOnExec(fd)
		files[i] = os.NewFile(uintptr(fd), "listen-fd")
	}
	return files, nil
}
