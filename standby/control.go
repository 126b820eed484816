package standby

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The supervisor's control socket, IMAGE_DIR/standby.sock (0600, in a
// directory only its owner can write): one line in ("wake", "sleep",
// "status"), one JSON line out. Only root and the supervisor's uid may use
// it.

// Reply is the control socket's answer.
type Reply struct {
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Status Status `json:"status"`
}

type controlServer struct {
	ln   *net.UnixListener
	path string
	s    *Supervisor
	wg   sync.WaitGroup
}

func startControl(dir string, s *Supervisor) (*controlServer, error) {
	path := filepath.Join(dir, controlSocketName)
	// A socket left by a supervisor that died: the directory's lock is
	// ours, so nobody else listens on it.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
		os.Remove(path)
	}
	ln, err := listenPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	c := &controlServer{ln: ln, path: path, s: s}
	c.wg.Go(c.serve)
	return c, nil
}

func (c *controlServer) close() {
	c.ln.Close()
	os.Remove(c.path)
	c.wg.Wait()
}

// listenPrivate listens on a Unix socket at path that is 0600 from the moment
// it appears there: it is bound in a new 0700 directory beside path, made
// 0600, then renamed into place. (Narrowing the umask instead would narrow
// it for every goroutine of the process.) The caller removes path when it
// closes the listener.
func listenPrivate(path string) (*net.UnixListener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	d, err := os.Open(tmp)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	// Bound through the directory's fd: a socket's path is limited to 107
	// bytes, and the temporary directory would push a path that fits
	// beyond it.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path)), Net: "unix"})
	if err != nil {
		return nil, err
	}
	bound := filepath.Join(tmp, filepath.Base(path))
	// Go would unlink the bound name on Close, which the rename moves.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(bound, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(bound, path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

func (c *controlServer) serve() {
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		c.handle(conn)
	}
}

func (c *controlServer) handle(conn *net.UnixConn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	enc := json.NewEncoder(conn)
	if !peerAllowed(conn) {
		enc.Encode(Reply{Error: "permission denied: only root or the owner of kcr standby may control it"})
		return
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && line == "" {
		return
	}
	r := Reply{OK: true}
	switch cmd := strings.TrimSpace(line); cmd {
	case "fds":
		// The service, restored or resumed, takes its listening sockets
		// back (notify.Listeners).
		c.sendFDs(conn)
		return
	case "wake":
		if !c.s.Wake("manual") {
			r = Reply{Error: "the service is not checkpointed (state " + string(c.s.State()) + ")"}
		}
	case "sleep":
		if !c.s.Sleep() {
			r = Reply{Error: "the service is not running (state " + string(c.s.State()) + ")"}
		}
	case "status":
	default:
		r = Reply{Error: fmt.Sprintf("unknown command %q: wake, sleep or status", cmd)}
	}
	r.Status = c.s.Status()
	enc.Encode(r)
}

// sendFDs answers "fds": one JSON line with the --listen sockets attached
// (SCM_RIGHTS).
func (c *controlServer) sendFDs(conn *net.UnixConn) {
	files := c.s.listenFiles()
	if len(files) == 0 {
		json.NewEncoder(conn).Encode(Reply{Error: "kcr standby has no --listen socket"})
		return
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	b, _ := json.Marshal(Reply{OK: true, Status: c.s.Status()})
	if _, _, err := conn.WriteMsgUnix(append(b, '\n'), unix.UnixRights(fds...), nil); err != nil {
		c.s.log.Warn("standby: handing the --listen socket back to the service", "err", err)
	}
}

func peerAllowed(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	return cerr == nil && (cred.Uid == 0 || int(cred.Uid) == os.Geteuid())
}

// Control sends cmd (wake, sleep, status) to the supervisor that owns
// imageDir and returns its answer; an answer with OK false is an error.
func Control(ctx context.Context, imageDir, cmd string) (Reply, error) {
	path := filepath.Join(imageDir, controlSocketName)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Reply{}, fmt.Errorf("no kcr standby answers on %s (%v): is one running with --image-dir %s?", path, err, imageDir)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(conn, cmd); err != nil {
		return Reply{}, fmt.Errorf("send %s to %s: %w", cmd, path, err)
	}
	var r Reply
	if err := json.NewDecoder(conn).Decode(&r); err != nil {
		return Reply{}, fmt.Errorf("read the answer to %s from %s: %w", cmd, path, err)
	}
	if !r.OK {
		return r, fmt.Errorf("kcr standby refused %s: %s", cmd, r.Error)
	}
	return r, nil
}
