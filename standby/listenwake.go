package standby

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// listenSource is the wake of --listen: a connection waiting on the
// socket the supervisor holds and hands to the service (LISTEN_FDS). The
// restored service accepts it; the supervisor only sees it queued.
type listenSource struct {
	ln  *net.TCPListener
	log *slog.Logger
}

// openListen opens the --listen socket, or takes it back from the service
// a previous kcr standby left running (listenback.go).
func openListen(o *Options, dir string, log *slog.Logger) (*listenSource, error) {
	ln, err := listen(o.Listen)
	if err != nil {
		var terr error
		if ln, terr = takeListener(dir, o.Listen, o.serviceUID()); terr != nil {
			return nil, err
		}
		log.Info("standby: took the --listen socket back from the running service", "listen", o.Listen)
	}
	return &listenSource{ln: ln, log: log}, nil
}

// listen opens --listen, which must be free.
func listen(addr string) (*net.TCPListener, error) {
	// Not MPTCP (Go's default for listeners): CRIU cannot dump it.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --listen %s: %v: choose a free address", ErrBadOption, addr, err)
	}
	return ln.(*net.TCPListener), nil
}

// file is a dup of the socket, handed to every cold start.
func (l *listenSource) file() (*os.File, error) { return l.ln.File() }

func (l *listenSource) Name() string { return "connection" }

// Busy: a connection is the service's business while it runs.
func (l *listenSource) Busy(context.Context) (string, error) { return "", nil }

// AbandonsCheckpoint: a connection that comes during a checkpoint waits in
// the backlog, and wakes the service once it is checkpointed.
func (l *listenSource) AbandonsCheckpoint() bool { return false }

func (l *listenSource) SaveState() (json.RawMessage, error) { return nil, nil }
func (l *listenSource) LoadState(json.RawMessage) error     { return nil }
func (l *listenSource) Close()                              { l.ln.Close() }

// Wait returns once a connection waits in the socket's backlog. It does
// not accept it: the restored service does.
func (l *listenSource) Wait(ctx context.Context) error {
	raw, err := l.ln.SyscallConn()
	if err != nil {
		l.log.Error("standby: --listen socket", "err", err)
		<-ctx.Done()
		return ctx.Err()
	}
	for ctx.Err() == nil {
		ready := false
		var perr error
		raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			var n int
			n, perr = unix.Poll(fds, 100)
			ready = n > 0 && fds[0].Revents&unix.POLLIN != 0
		})
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			l.log.Error("standby: poll --listen socket", "err", perr)
			<-ctx.Done()
			return ctx.Err()
		}
		if ready {
			return nil
		}
	}
	return ctx.Err()
}
