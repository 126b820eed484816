package notify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/notify/proto"
)

// Defaults for checkpoint requests that leave a value out, and the bounds
// the app holds to whatever the CLI asks: the contract's, see package proto.
const (
	DefaultHookBudget    = proto.DefaultHookBudget
	DefaultResumeAfter   = proto.DefaultResumeAfter
	DefaultMaxSuspend    = proto.DefaultMaxSuspend
	DefaultAfterBudget   = proto.DefaultAfterBudget
	DefaultMaxHookBudget = proto.DefaultMaxHookBudget
)

// SocketPrefix and SocketSuffix frame the base name of every control socket
// (proto.SocketName).
const (
	SocketPrefix = proto.SocketPrefix
	SocketSuffix = proto.SocketSuffix
)

// Server is a registry's control socket: a listening Unix socket, mode 0600,
// that accepts only root and the process's own user.
type Server struct {
	g    *Registry
	cfg  serverConfig
	ln   *net.UnixListener
	path string
	pid  int
	uid  int

	mu        sync.Mutex
	state     string
	followups chan followup // non-nil while waiting for a follow-up
	closed    bool
	// draining is set by Shutdown: new checkpoints are refused.
	draining bool
	// knownStart is the key (instanceKey) of the instance the hooks last saw;
	// watch runs a restore when it changes outside a cycle.
	knownStart uint64
	quit       chan struct{} // closed by Close
	wg         sync.WaitGroup
}

type followup struct {
	msg   proto.Message
	reply chan proto.Message // receives TypeDone; buffered
}

// Start opens the registry's control socket and serves it until Close.
func (g *Registry) Start(opts ...Opt) (*Server, error) {
	cfg := defaultServerConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	pid := cfg.hostPID()
	path := cfg.path
	if path == "" {
		dir := cfg.dir
		if dir == "" {
			dir = defaultSocketDir()
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("notify: create socket dir: %w", err)
		}
		path = filepath.Join(dir, proto.SocketName(pid))
	}
	path, err := safeSocketPath(path)
	if err != nil {
		return nil, err
	}
	if !proto.IsSocketName(path) {
		return nil, fmt.Errorf("notify: socket name %q must look like kcr-NAME.sock so that kcr can find it", filepath.Base(path))
	}
	ln, err := listen(path)
	if err != nil {
		return nil, err
	}
	st, _ := cfg.instance(pid)
	s := &Server{g: g, cfg: cfg, ln: ln, path: path, pid: pid, uid: os.Geteuid(), state: "idle", knownStart: st, quit: make(chan struct{})}
	s.wg.Add(2)
	go s.serve(ln)
	go s.watch()
	cfg.log.Debug("kcr control socket listening", "path", path)
	return s, nil
}

// Path returns the control socket's path.
func (s *Server) Path() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.path
}

// Close stops serving and removes the socket. A checkpoint cycle that is
// waiting for its follow-up resumes first.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.quit)
	ln := s.ln
	s.mu.Unlock()
	err := ln.Close()
	s.wg.Wait()
	return err
}

// Shutdown closes the server gracefully: it refuses new checkpoints, waits
// until a running checkpoint cycle has finished (kcr's follow-up and the
// after-restore hooks) or ctx ends, and then closes as Close does, so that a
// cycle still waiting resumes. It returns ctx's error if ctx ended first.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	t := time.NewTicker(s.cfg.pollEvery)
	defer t.Stop()
	var cerr error
	for cerr == nil && s.g.cycling() {
		select {
		case <-ctx.Done():
			cerr = fmt.Errorf("notify: shutdown: checkpoint cycle still running, resumed it: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
	return errors.Join(s.Close(), cerr)
}
