package notify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/notify/proto"
)

// This file binds the control socket: where, how safely, and the move to a
// new PID after a restore.

// safeSocketPath checks that nobody but this process's user can change
// what is bound at path: its directory is a real directory (not a symlink)
// owned by the effective uid that neither group nor others may write to
// (reading it lets nobody replace the socket, which is 0600 anyway).
// Symlinks above it are resolved, because kcr follows none when it
// connects.
func safeSocketPath(path string) (string, error) {
	if i := strings.IndexFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return "", fmt.Errorf("notify: socket path %q holds a control character: choose another WithSocketPath or KCR_SOCKET_DIR", path)
	}
	dir, base := filepath.Split(filepath.Clean(path))
	dir = filepath.Clean(dir)
	parent, err := filepath.EvalSymlinks(filepath.Dir(dir))
	if err != nil {
		return "", fmt.Errorf("notify: socket dir %s: %w", dir, err)
	}
	if dir != "/" {
		dir = filepath.Join(parent, filepath.Base(dir))
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("notify: socket dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("notify: socket dir %s: no owner information", dir)
	}
	switch {
	case !fi.IsDir():
		return "", fmt.Errorf("notify: socket dir %s is a %v, not a directory: remove it, or choose another KCR_SOCKET_DIR", dir, fi.Mode().Type())
	case int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("notify: socket dir %s belongs to uid %d, not to this process's uid %d, so its owner could replace the control socket: remove it, or choose another KCR_SOCKET_DIR", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("notify: socket dir %s has mode %04o, so others could replace the control socket: chmod 700 %s", dir, fi.Mode().Perm(), dir)
	}
	return filepath.Join(dir, base), nil
}

// listen binds a control socket at path, mode 0600.
func listen(path string) (*net.UnixListener, error) {
	if live := removeStale(path); live {
		return nil, fmt.Errorf("notify: listen on %s: another process is serving a control socket there (pass another WithSocketPath or WithSocketDir): %w", path, syscall.EADDRINUSE)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("notify: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("notify: chmod %s: %w", path, err)
	}
	return ln, nil
}

// rebind moves the control socket to a path named after the process's new
// host PID. Clones restored from one image in PID namespaces of their own
// share the image's socket path; each moves to its own so that kcr reaches
// every clone through its PID. The old path is left alone: it may be a
// sibling's by now.
func (s *Server) rebind(pid int) {
	s.mu.Lock()
	old, oldPath := s.ln, s.path
	closed := s.closed
	s.mu.Unlock()
	if closed || pid == s.pid {
		return
	}
	path := filepath.Join(filepath.Dir(oldPath), proto.MovedSocketName(filepath.Base(oldPath), s.pid, pid))
	ln, err := listen(path)
	if err != nil {
		s.cfg.log.Warn("kcr: cannot move the control socket after restore; keeping the old one", "path", path, "err", err)
		return
	}
	s.mu.Lock()
	if s.closed {
		// Close ran while we bound: it closed the old listener only, and
		// waits for this goroutine, so serving ln would never end.
		s.mu.Unlock()
		ln.Close()
		return
	}
	s.ln, s.path, s.pid = ln, path, pid
	s.wg.Add(1) // under s.mu, so that Close's Wait counts it
	s.mu.Unlock()
	old.SetUnlinkOnClose(false)
	old.Close()
	go s.serve(ln)
	s.cfg.log.Debug("kcr control socket moved after restore", "path", path)
}

func defaultSocketDir() string {
	if d := os.Getenv("KCR_SOCKET_DIR"); d != "" {
		return d
	}
	if os.Getuid() == 0 {
		return "/run/kcr"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kcr")
	}
	return filepath.Join(os.TempDir(), "kcr-"+strconv.Itoa(os.Getuid()))
}

// removeStale removes a socket file left behind by a dead process, but never
// one that somebody still listens on; it reports whether one does. Only
// ECONNREFUSED proves that nobody listens: a full backlog (EAGAIN), a timeout
// or EACCES do not, and the file is then left alone for bind to fail on.
func removeStale(path string) (live bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		return false
	}
	c, err := net.DialTimeout("unix", path, 200*time.Millisecond)
	if err == nil {
		c.Close()
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(path)
	}
	return false
}
