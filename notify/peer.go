package notify

import (
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/proto"
)

// peer identifies the kcr process on the other end of a control connection:
// its PID (in our /proc) and its start time, so that a PID reused by another
// process is not taken for kcr.
type peer struct {
	pid   int
	start uint64
}

// newPeer identifies kcr by SO_PEERCRED's PID. That is 0 when kcr is
// outside our PID namespace (a service under "kcr run"); /proc is then still
// the host's, so the PID and start time kcr named in its request are used,
// if /proc shows that process, with that start time, owned by the peer's
// uid. A peer it cannot identify is not watched (pid 0).
func newPeer(cred *unix.Ucred, m proto.Message) peer {
	p := peer{pid: int(cred.Pid)}
	if p.pid == 0 && m.KCRPID > 0 {
		var st unix.Stat_t
		if unix.Stat("/proc/"+strconv.Itoa(m.KCRPID), &st) != nil || st.Uid != cred.Uid {
			return peer{}
		}
		p.pid = m.KCRPID
	}
	if p.pid > 0 {
		if st, err := procfs.StartTime(p.pid); err == nil && (int(cred.Pid) != 0 || st == m.KCRStart) {
			p.start = st
		} else {
			p.pid = 0
		}
	}
	return p
}

// watchable reports whether gone can tell.
func (p peer) watchable() bool { return p.pid > 0 }

// gone reports whether the peer process has exited (or is a zombie). It
// reads /proc and holds no file descriptor, so CRIU may dump the app at any
// moment of the watch.
func (p peer) gone() bool {
	if p.pid <= 0 {
		return false
	}
	st, err := procfs.ReadStat(p.pid)
	if err != nil {
		return os.IsNotExist(err)
	}
	return st.StartTime != p.start || st.Zombie()
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
