package notify

import (
	"errors"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/proto"
)

// This file accepts control connections, checks the peer and dispatches
// its request.

func (s *Server) serve(ln *net.UnixListener) {
	defer s.wg.Done()
	sem := make(chan struct{}, 8) // bound concurrent control connections
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.cfg.log.Warn("kcr control socket accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			s.handle(c)
		}()
	}
}

// peerAllowed accepts root and the socket owner's uid.
func (s *Server) peerAllowed(c *net.UnixConn) (*unix.Ucred, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return nil, false
	}
	return cred, cred.Uid == 0 || int(cred.Uid) == s.uid
}

// identifyPeer is newPeer with the pidfd of c's peer, when kcr is outside
// our PID namespace (SO_PEERCRED says 0); the pidfd is closed before the
// checkpoint, so that CRIU never finds it in the app.
func identifyPeer(c *net.UnixConn, cred *unix.Ucred, m proto.Message) peer {
	pidfd := -1
	if cred.Pid == 0 {
		if raw, err := c.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) { pidfd = peerPIDFD(int(fd)) })
		}
	}
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	return newPeer(cred, m, pidfd)
}

// handle answers one connection to the control socket: one request, one
// answer, except a checkpoint, which keeps c until it answers "ready".
func (s *Server) handle(c *net.UnixConn) {
	closeConn := true
	defer func() {
		if closeConn {
			c.Close()
		}
	}()
	cred, ok := s.peerAllowed(c)
	if !ok {
		s.refusePeer(c, cred)
		return
	}
	m, ok := s.readRequest(c)
	if !ok {
		return
	}
	switch m.Type {
	case proto.TypeHello:
		s.reply(c, s.info())
	case proto.TypeActivity:
		a := s.g.Activity()
		m := s.info()
		m.Activity, m.OpenConns, m.HooksInFlight = a.Count, a.OpenConns, a.HooksInFlight
		s.reply(c, m)
	case proto.TypeCheckpoint:
		s.mu.Lock()
		draining := s.draining
		s.mu.Unlock()
		if draining {
			s.reply(c, proto.Message{Type: proto.TypeBusy, Error: "the app is shutting down its control socket"})
			return
		}
		// checkpoint closes c itself, before it answers "ready".
		closeConn = false
		s.checkpoint(c, m, identifyPeer(c, cred, m))
	case proto.TypeResume, proto.TypeRestored:
		s.reply(c, s.followUp(m))
	default:
		s.reply(c, proto.Message{Type: proto.TypeError, Error: "unexpected message type " + m.Type})
	}
}

// refusePeer answers a peer of another uid (cred, when known) with an error.
func (s *Server) refusePeer(c *net.UnixConn, cred *unix.Ucred) {
	attrs := []any{"path", s.Path()}
	if cred != nil {
		attrs = append(attrs, "peer_uid", cred.Uid, "peer_pid", cred.Pid)
	}
	s.cfg.log.Warn("kcr control socket: refused peer with another uid", attrs...)
	// Take the request first: answering and closing before it came in
	// would make the peer's write fail (EPIPE) and hide the answer.
	c.SetReadDeadline(time.Now().Add(time.Second))
	proto.Read(c)
	c.SetWriteDeadline(time.Now().Add(time.Second))
	proto.Write(c, proto.Message{Type: proto.TypeError, Error: "permission denied: only root or the process owner may control it"})
}

// readRequest reads the peer's request, within 5 s and cut short by Close;
// a bad request is answered with an error and ok is false.
func (s *Server) readRequest(c *net.UnixConn) (m proto.Message, ok bool) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Close must not wait for a client that connected and sends nothing.
	stopRead := make(chan struct{})
	go func() {
		select {
		case <-s.quit:
			c.SetReadDeadline(time.Now())
		case <-stopRead:
		}
	}()
	m, err := proto.Read(c)
	close(stopRead)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.cfg.log.Warn("kcr control socket: bad request", "err", err)
			c.SetWriteDeadline(time.Now().Add(time.Second))
			proto.Write(c, proto.Message{Type: proto.TypeError, Error: err.Error()})
		}
		return m, false
	}
	c.SetReadDeadline(time.Time{})
	return m, true
}

// followUp hands a resume or restored message to the checkpoint waiting
// for it and returns its answer, given when the hooks finish (the CLI
// bounds its own wait).
func (s *Server) followUp(m proto.Message) proto.Message {
	f := followup{msg: m, reply: make(chan proto.Message, 1)}
	// Hand f over under s.mu: checkpoint clears s.followups and drains
	// the channel under s.mu too, so f is either taken by await or
	// answered by the drain, never left without an answer.
	s.mu.Lock()
	ch := s.followups
	queued := false
	if ch != nil {
		select {
		case ch <- f:
			queued = true
		default:
		}
	}
	s.mu.Unlock()
	if ch == nil && m.Type == proto.TypeRestored {
		if done, ok := s.restoredMessage(m); ok {
			return done
		}
	}
	if ch == nil {
		return proto.Message{Type: proto.TypeError, Error: "no checkpoint is waiting for a " + m.Type + " message"}
	}
	if !queued {
		return proto.Message{Type: proto.TypeError, Error: "a follow-up is already being handled"}
	}
	return <-f.reply
}

func (s *Server) reply(c *net.UnixConn, m proto.Message) error {
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	err := proto.Write(c, m)
	if errors.Is(err, proto.ErrTooLarge) {
		// Huge hook errors or details must not cost the CLI its answer.
		s.cfg.log.Warn("kcr control socket: reply too large; dropping report details", "type", m.Type)
		err = proto.Write(c, proto.Fit(m))
	}
	if err != nil {
		s.cfg.log.Debug("kcr control socket: reply", "type", m.Type, "err", err)
	}
	return err
}

func (s *Server) info() proto.Message {
	_, st, _ := procfs.Self()
	gen, id := s.g.Identity()
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	return proto.Message{Type: proto.TypeInfo, PID: s.hostPID(), StartTime: st, Resources: s.g.Names(),
		State: state, InstanceID: id, AppGeneration: gen}
}

func (s *Server) hostPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}
