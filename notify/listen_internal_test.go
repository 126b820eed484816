package notify

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A handed-over listener gives its socket up for a checkpoint (connections
// queue in the supervisor's socket meanwhile, none is accepted), fetches it
// back after the restore and accepts every queued connection; Accept never
// fails in between.
func TestListenersHandBack(t *testing.T) {
	kcrLn, kcrFile := kcrListener(t)
	// The supervisor's socket: answers "fds" with kcrFile.
	sock := filepath.Join(t.TempDir(), "sup.sock")
	fetches := make(chan struct{}, 8)
	fakeSupervisor(t, sock, kcrFile, fetches)

	g := NewRegistry()
	addr := kcrLn.Addr().String()
	var queued []net.Conn
	var accepted chan net.Conn
	var lns []net.Listener
	// Registered first: its before hook runs after the listeners gave the
	// socket up, its after hook before they fetch it back.
	g.Register("probe", Func(func(context.Context) error {
		for range 3 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			queued = append(queued, c)
		}
		time.Sleep(100 * time.Millisecond)
		if n := len(accepted); n > 0 {
			return errors.New("a connection was accepted while the socket was given up")
		}
		return nil
	}, nil))
	dup, err := kcrLn.File()
	if err != nil {
		t.Fatal(err)
	}
	lns, err = handOver(g, []*os.File{dup}, sock)
	if err != nil || len(lns) != 1 {
		t.Fatalf("handOver: %v, %d listeners", err, len(lns))
	}
	ln := lns[0]
	defer ln.Close()
	accepted = make(chan net.Conn, 8)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	c0, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no Accept before the checkpoint")
	}

	res, err := g.Simulate(context.Background(), SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v, before %v, after %v", err, res.BeforeErr, res.AfterErr)
	}
	// The fake supervisor signals after its answer is written, so the
	// restore can return first: wait for the signal.
	select {
	case <-fetches:
	case <-time.After(5 * time.Second):
		t.Fatal("the listeners did not fetch the socket back")
	}
	for i := range queued {
		select {
		case c := <-accepted:
			c.Close()
		case err := <-acceptErr:
			t.Fatalf("Accept failed across the checkpoint: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d queued connections accepted after the restore", i, len(queued))
		}
	}
	for _, c := range queued {
		c.Close()
	}
	ln.Close()
	if err := <-acceptErr; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// A supervisor that does not answer when the service is restored (it was
// killed, and its service manager restarts it) is asked again until it
// does: Accept waits meanwhile instead of failing for good, and accepts
// once the sockets are back.
func TestListenersFetchAgain(t *testing.T) {
	defer func(d time.Duration) { fetchRetry = d }(fetchRetry)
	fetchRetry = 20 * time.Millisecond
	kcrLn, kcrFile := kcrListener(t)
	dup, err := kcrLn.File()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "sup.sock") // nobody listens yet
	g := NewRegistry()
	lns, err := handOver(g, []*os.File{dup}, sock)
	if err != nil || len(lns) != 1 {
		t.Fatalf("handOver: %v, %d listeners", err, len(lns))
	}
	ln := lns[0]
	defer ln.Close()
	res, err := g.Simulate(context.Background(), SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr == nil {
		t.Fatalf("simulate: %v, before %v, after %v; want the fetch reported as pending", err, res.BeforeErr, res.AfterErr)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c0, err := net.Dial("tcp", kcrLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	select {
	case err := <-accepted:
		t.Fatalf("Accept returned (%v) before the supervisor answered", err)
	case <-time.After(100 * time.Millisecond):
	}
	// The supervisor is back.
	fakeSupervisor(t, sock, kcrFile, nil)
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatalf("Accept: %v, want the queued connection", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the queued connection was not accepted after the supervisor came back")
	}
}

// A restored copy serves no request on its handed-over listener before its
// own after-restore hooks, registered after Listeners as recommended, ran:
// Accept waits until the whole cycle is over.
func TestListenersWaitForRestoreHooks(t *testing.T) {
	kcrLn, kcrFile := kcrListener(t)
	sock := filepath.Join(t.TempDir(), "sup.sock")
	fakeSupervisor(t, sock, kcrFile, nil)
	g := NewRegistry()
	dup, err := kcrLn.File()
	if err != nil {
		t.Fatal(err)
	}
	lns, err := handOver(g, []*os.File{dup}, sock)
	if err != nil || len(lns) != 1 {
		t.Fatalf("handOver: %v, %d listeners", err, len(lns))
	}
	defer lns[0].Close()
	accepted := make(chan struct{}, 8)
	go func() {
		for {
			c, err := lns[0].Accept()
			if err != nil {
				return
			}
			c.Close()
			accepted <- struct{}{}
		}
	}()
	hookDone := make(chan struct{})
	var early bool
	// The app's own restore hook, registered after Listeners: a
	// connection made while it runs must wait for it.
	g.Register("app", Func(nil, func(context.Context, Event) error {
		c, err := net.Dial("tcp", kcrLn.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		select {
		case <-accepted:
			early = true
		case <-time.After(300 * time.Millisecond):
		}
		close(hookDone)
		return nil
	}))
	res, err := g.Simulate(context.Background(), SimRestore, 5*time.Second)
	if err != nil || res.BeforeErr != nil || res.AfterErr != nil {
		t.Fatalf("simulate: %v, before %v, after %v", err, res.BeforeErr, res.AfterErr)
	}
	<-hookDone
	if early {
		t.Fatal("a connection was accepted before the app's after-restore hook ran")
	}
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection made during the hook was not accepted after the cycle")
	}
}

// fakeSupervisor listens on sock as kcr standby does and answers each
// "fds" request with a copy of ln, signalling fetches (if not nil) after
// its answer is written. It serves a copy of ln's descriptor of its own and
// stops, its last answer written, before the test's deferred closes run
// out: a request still on its way as the test ends must not read a file
// the test closes.
func fakeSupervisor(t *testing.T, sock string, ln *os.File, fetches chan<- struct{}) {
	t.Helper()
	fd, err := unix.Dup(int(ln.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := sup.AcceptUnix()
			if err != nil {
				return
			}
			if line, _ := bufio.NewReader(c).ReadString('\n'); line == "fds\n" {
				c.WriteMsgUnix([]byte("{}\n"), unix.UnixRights(fd), nil)
				select {
				case fetches <- struct{}{}: // nil: never
				default: // nobody waits for it
				}
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		sup.Close()
		<-done
		unix.Close(fd)
	})
}

// kcrListener is kcr standby's --listen socket and a file of it, closed when
// the test ends.
func kcrListener(t *testing.T) (*net.TCPListener, *os.File) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return ln.(*net.TCPListener), f
}
