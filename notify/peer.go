package notify

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/proto"
)

// peer identifies the kcr process on the other end of a control connection
// by its PID in our /proc.
type peer struct {
	pid int
}

// newPeer identifies kcr by SO_PEERCRED's PID. That is 0 when kcr is
// outside our PID namespace (a service under "kcr run"); /proc is then still
// the host's, and kcr names its PID in its request. pidfd, kcr's pidfd from
// SO_PEERPIDFD (-1 if the kernel has none), proves that name: its fdinfo
// gives the peer's PID in /proc's namespace. Without it, the start time kcr
// named must match, which fails in a restored copy, whose time namespace
// shifts every start time it reads. The process must be owned by the
// peer's uid. A peer it cannot identify is not watched (pid 0).
func newPeer(cred *unix.Ucred, m proto.Message, pidfd int) peer {
	p := peer{pid: int(cred.Pid)}
	vouched := p.pid != 0
	if p.pid == 0 && m.KCRPID > 0 {
		var st unix.Stat_t
		if unix.Stat("/proc/"+strconv.Itoa(m.KCRPID), &st) != nil || st.Uid != cred.Uid {
			return peer{}
		}
		if pidfd >= 0 {
			if pidfdPID(pidfd) != m.KCRPID {
				return peer{}
			}
			vouched = true
		}
		p.pid = m.KCRPID
	}
	if p.pid > 0 {
		st, err := procfs.StartTime(p.pid)
		switch {
		case err != nil || !vouched && st != m.KCRStart:
			p.pid = 0
		case pidfd >= 0 && pidfdExited(pidfd):
			// The start time read may be another process's that took
			// the PID since.
			p.pid = 0
		}
	}
	return p
}

// soPeerPIDFD is SO_PEERPIDFD (Linux 6.5), which x/sys/unix does not name.
// 77 is its value on the architectures of genericSockopts; others number
// it otherwise, and there no pidfd is asked for.
const soPeerPIDFD = 77

var genericSockopts = map[string]bool{"amd64": true, "386": true, "arm64": true, "arm": true,
	"riscv64": true, "loong64": true, "ppc64": true, "ppc64le": true}

// peerPIDFD returns a pidfd of the process that connected c, or -1.
func peerPIDFD(fd int) int {
	if !genericSockopts[runtime.GOARCH] {
		return -1
	}
	pfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soPeerPIDFD)
	if err != nil {
		return -1
	}
	return pfd
}

// pidfdPID returns the PID of the process that pidfd refers to, as /proc
// names it (its "Pid:" in fdinfo; -1 once it exited), or 0.
func pidfdPID(pidfd int) int {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// pidfdExited reports whether the process of pidfd has exited: a pidfd
// polls readable then.
func pidfdExited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err != nil || n > 0
}

// watchable reports whether gone can tell.
func (p peer) watchable() bool { return p.pid > 0 }

// gone reports whether the peer process has exited (or is a zombie). It
// opens no file: it is polled while kcr dumps the app, and an fd open at
// the freeze would be in the image, where a restore fails to open
// /proc/<kcr>/stat again once that kcr is gone. A PID that another process
// took is not told apart; within the wait for kcr (at most the resume
// timeout) that needs the PIDs to wrap around.
func (p peer) gone() bool {
	if p.pid <= 0 {
		return false
	}
	// Through /proc, not kill(2): kcr's PID is in /proc's namespace, which
	// need not be ours. A zombie has no executable left; another uid's
	// process answers EACCES (alive, as far as this can tell).
	_, err := os.Readlink("/proc/" + strconv.Itoa(p.pid) + "/exe")
	return errors.Is(err, fs.ErrNotExist)
}

// hangup returns a channel closed when the peer of c closes its end (kcr
// exited or was killed) and a function that stops watching; c must not be
// read by anyone else until stop returns. kcr sends nothing after its
// checkpoint request, so any read result means the peer went away.
func hangup(c *net.UnixConn) (gone <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		_, err := c.Read(b[:])
		select {
		case <-stopped:
			// Our own deadline: not a hangup.
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return
			}
		default:
		}
		close(ch)
	}()
	return ch, func() {
		close(stopped)
		c.SetReadDeadline(time.Now())
		<-done
		c.SetReadDeadline(time.Time{})
	}
}
