package client

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/proto"
)

// Socket is a process's control socket as Find found it. kcr may run as
// root against a process of another user, who chose the path and can
// change what is behind it, so every connection is made afresh and checked:
//
//   - the path is resolved inside the process's root (/proc/<pid>/root)
//     without following any symlink, and connected to through the file
//     descriptor of what it resolved to, whatever its length;
//   - the listener on the other end (SO_PEERCRED) must be the process or
//     one of its descendants, and run as root or as the process's user.
type Socket struct {
	PID  int    // the process, as seen from kcr
	Path string // the path it bound, in its own mount namespace
}

// String returns the socket's path.
func (s *Socket) String() string { return s.Path }

// Hello asks the app who it is.
func (s *Socket) Hello(ctx context.Context) (proto.Message, error) {
	return hello(ctx, s.dial, s.Path)
}

// Activity is [Activity] on s.
func (s *Socket) Activity(ctx context.Context) (proto.Message, error) {
	return activity(ctx, s.dial, s.Path)
}

// Checkpoint is [Checkpoint] on s.
func (s *Socket) Checkpoint(ctx context.Context, req CheckpointRequest) (proto.Message, error) {
	return checkpoint(ctx, s.dial, s.Path, req)
}

// Resume is [Resume] on s.
func (s *Socket) Resume(ctx context.Context, reason string, wait time.Duration) (proto.Message, error) {
	return followup(ctx, s.dial, s.Path, proto.Message{Type: proto.TypeResume, Reason: reason, Wait: wait}, wait)
}

// RestoredAs is [RestoredAs] on s.
func (s *Socket) RestoredAs(ctx context.Context, generation uint64, name string, wait time.Duration) (proto.Message, error) {
	return followup(ctx, s.dial, s.Path, proto.Message{Type: proto.TypeRestored, Generation: generation, Name: name, Wait: wait}, wait)
}

// dial connects to s and checks who listens on it.
func (s *Socket) dial(ctx context.Context) (*net.UnixConn, error) {
	if strings.IndexFunc(s.Path, isControl) >= 0 || !strings.HasPrefix(s.Path, "/") {
		return nil, fmt.Errorf("%w: path %q of PID %d is not a clean absolute path", ErrUnsafeSocket, s.Path, s.PID)
	}
	root, err := unix.Open("/proc/"+strconv.Itoa(s.PID)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("root of PID %d: %w", s.PID, err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, s.Path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == unix.ELOOP {
		return nil, fmt.Errorf("%w: %s of PID %d goes through a symlink: refusing to follow it", ErrUnsafeSocket, s.Path, s.PID)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to control socket %s of PID %d: %w", s.Path, s.PID, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("connect to control socket %s of PID %d: %w", s.Path, s.PID, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%w: %s of PID %d is not a socket", ErrUnsafeSocket, s.Path, s.PID)
	}
	c, err := dialPath(ctx, "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("connect to control socket %s of PID %d: %w", s.Path, s.PID, err)
	}
	if err := s.checkPeer(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkPeer accepts a listener that is s.PID or one of its descendants,
// running as root or as one of s.PID's uids. (A listener CRIU restored was
// created before the process got its credentials back: root.)
func (s *Socket) checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("control socket %s of PID %d: peer credentials: %w", s.Path, s.PID, cerr)
	}
	uids, err := procUIDs(s.PID)
	if err != nil {
		return fmt.Errorf("PID %d: %w", s.PID, err)
	}
	uidOK := cred.Uid == 0
	for _, u := range uids {
		uidOK = uidOK || u == cred.Uid
	}
	if !uidOK || !inTree(procPID(int(cred.Pid), s.PID), s.PID) {
		return fmt.Errorf("%w: %s of PID %d is served by PID %d (uid %d), not by that process or a child of it as its user or root: refusing to talk to it",
			ErrUnsafeSocket, s.Path, s.PID, cred.Pid, cred.Uid)
	}
	return nil
}

// procUIDs returns the real, effective and saved uids of pid.
func procUIDs(pid int) ([]uint32, error) {
	st, err := procfs.ReadStatus(pid)
	if err != nil {
		return nil, fmt.Errorf("PID %d: %w", pid, err)
	}
	return st.UIDs[:3], nil
}

// inTree reports whether pid is root or a descendant of it.
// procPID maps the listener's PID from SO_PEERCRED, which the kernel gives
// in this process's PID namespace, to its PID in /proc (whose namespace may
// be an ancestor): CRIU runs its action scripts inside the PID namespace of
// a pod it restores into (containerd's CRI restore), with the host's /proc.
// Only a process of root's tree in this process's own PID namespace, with
// that PID there, maps; otherwise pid is returned as it is.
func procPID(pid, root int) int {
	self := nsPIDs("self")
	if len(self) <= 1 {
		return pid // this process's namespace is /proc's
	}
	myNS, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return pid
	}
	for _, p := range procfs.Tree(root) {
		ns, err := os.Readlink("/proc/" + strconv.Itoa(p) + "/ns/pid")
		if err != nil || ns != myNS {
			continue
		}
		if ids := nsPIDs(strconv.Itoa(p)); len(ids) > 0 && ids[len(ids)-1] == pid {
			return p
		}
	}
	return pid
}

// nsPIDs returns the NSpid line of /proc/<which>/status: the process's PID
// in /proc's namespace and in each nested one down to its own.
func nsPIDs(which string) []int {
	b, err := os.ReadFile("/proc/" + which + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var ids []int
			for _, f := range strings.Fields(rest) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil
				}
				ids = append(ids, n)
			}
			return ids
		}
	}
	return nil
}

func inTree(pid, root int) bool {
	for range 64 {
		if pid == root {
			return true
		}
		if pid <= 1 {
			return false
		}
		pid = ppid(pid)
	}
	return false
}

func ppid(pid int) int {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.PPID
}
