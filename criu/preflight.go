package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// ipprotoMPTCP is IPPROTO_MPTCP: Go >= 1.24 listens with it by default and
// CRIU cannot dump it ("Unsupported proto 262").
const ipprotoMPTCP = 262

// Problem is a socket of the target tree that CRIU will refuse to dump.
type Problem struct {
	PID   int    // process holding the socket
	FD    int    // its descriptor number in PID
	Inode uint64 // socket inode
	Cause Cause  // CauseMPTCP, CauseTCPEstablished or CauseExternalUnix
	// Desc describes the socket, e.g.
	// "TCP 127.0.0.1:41234 -> 127.0.0.1:9092 established".
	Desc string
	// Peer is a TCP or MPTCP socket's remote address (invalid otherwise),
	// so that callers can tell what it is connected to.
	Peer netip.AddrPort
}

// String formats p as "pid 123 fd 7: <Desc>".
func (p Problem) String() string {
	return fmt.Sprintf("pid %d fd %d: %s", p.PID, p.FD, p.Desc)
}

// Hint returns the advice for p's cause.
func (p Problem) Hint() string { return p.Cause.Hint() }

// Preflight inspects every socket of the process tree rooted at pid, before
// dumping it, and reports the ones CRIU will refuse: MPTCP sockets, TCP
// connections (anything but listening or closed sockets; these need
// TCPClose or TCPEstablished) and connected Unix sockets whose peer lies
// outside the tree (best effort: the peer is looked up with sock_diag in
// kcr's network namespace, falling back to the peer's credentials). It
// borrows each socket with pidfd_getfd, which needs the same privileges as a
// dump, and does not disturb the target. An empty result means no socket
// problem was found, not that the dump will succeed.
func Preflight(pid int) ([]Problem, error) {
	tree := procfs.Tree(pid)
	inTree := map[int]bool{}
	for _, p := range tree {
		inTree[p] = true
	}
	socks, treeInodes, err := treeSockets(pid, tree)
	if err != nil {
		return nil, err
	}
	var problems []Problem
	pidfds := map[int]int{}
	defer func() {
		for _, fd := range pidfds {
			unix.Close(fd)
		}
	}()
	for _, s := range socks {
		pfd, ok := pidfds[s.pid]
		if !ok {
			var err error
			pfd, err = unix.PidfdOpen(s.pid, 0)
			if err != nil {
				if s.pid == pid {
					return nil, fmt.Errorf("criu preflight: pidfd_open(%d): %w", pid, err)
				}
				continue
			}
			pidfds[s.pid] = pfd
		}
		fd, err := unix.PidfdGetfd(pfd, s.fd, 0)
		if err != nil {
			if errors.Is(err, unix.EBADF) || errors.Is(err, unix.ESRCH) {
				continue // closed or exited meanwhile
			}
			return nil, fmt.Errorf("criu preflight: pidfd_getfd(pid %d, fd %d): %w", s.pid, s.fd, err)
		}
		cause, desc := inspectSocket(fd, s.ino, treeInodes, inTree)
		peer := peerAddr(fd)
		unix.Close(fd)
		if cause != CauseUnknown {
			problems = append(problems, Problem{PID: s.pid, FD: s.fd, Inode: s.ino, Cause: cause, Desc: desc, Peer: peer})
		}
	}
	sort.SliceStable(problems, func(i, j int) bool {
		if problems[i].PID != problems[j].PID {
			return problems[i].PID < problems[j].PID
		}
		return problems[i].FD < problems[j].FD
	})
	return problems, nil
}

// treeSock is a socket descriptor of a process of the tree.
type treeSock struct {
	pid, fd int
	ino     uint64
}

// treeSockets lists the sockets of the tree's processes, each inode once,
// and the set of those inodes. Only the root's /proc going away is an
// error: a child may exit meanwhile.
func treeSockets(pid int, tree []int) ([]treeSock, map[uint64]bool, error) {
	var socks []treeSock
	treeInodes := map[uint64]bool{}
	for _, p := range tree {
		dir := "/proc/" + strconv.Itoa(p) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			if p == pid {
				return nil, nil, fmt.Errorf("criu preflight: process %d: %w", pid, err)
			}
			continue // a child that just exited
		}
		for _, e := range ents {
			link, err := os.Readlink(dir + "/" + e.Name())
			if err != nil {
				continue
			}
			ino, ok := socketInode(link)
			if !ok {
				continue
			}
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if !treeInodes[ino] {
				socks = append(socks, treeSock{p, fd, ino})
			}
			treeInodes[ino] = true
		}
	}
	return socks, treeInodes, nil
}

func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok || !strings.HasSuffix(s, "]") {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
	return n, err == nil
}

var tcpStates = map[uint8]string{
	1: "established", 2: "syn-sent", 3: "syn-recv", 4: "fin-wait-1", 5: "fin-wait-2",
	6: "time-wait", 7: "closed", 8: "close-wait", 9: "last-ack", 10: "listening", 11: "closing",
}

// inspectSocket classifies one borrowed socket.
func inspectSocket(fd int, ino uint64, treeInodes map[uint64]bool, inTree map[int]bool) (Cause, string) {
	domain, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	proto, err3 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err1 != nil || err2 != nil || err3 != nil {
		return CauseUnknown, ""
	}
	switch domain {
	case unix.AF_INET, unix.AF_INET6:
		local, peer := sockAddr(unix.Getsockname(fd)), sockAddr(unix.Getpeername(fd))
		if proto == ipprotoMPTCP {
			state := "socket"
			if info, err := unix.GetsockoptTCPInfo(fd, unix.SOL_TCP, unix.TCP_INFO); err == nil {
				state = tcpStates[info.State]
			}
			return CauseMPTCP, describe("MPTCP", local, peer, state)
		}
		if typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP {
			return CauseUnknown, ""
		}
		info, err := unix.GetsockoptTCPInfo(fd, unix.SOL_TCP, unix.TCP_INFO)
		if err != nil {
			return CauseUnknown, ""
		}
		if info.State == 10 || info.State == 7 { // listening, closed
			return CauseUnknown, ""
		}
		state := tcpStates[info.State]
		if state == "" {
			state = "state " + strconv.Itoa(int(info.State))
		}
		return CauseTCPEstablished, describe("TCP", local, peer, state)
	case unix.AF_UNIX:
		kind := map[int]string{unix.SOCK_STREAM: "Unix stream", unix.SOCK_DGRAM: "Unix datagram", unix.SOCK_SEQPACKET: "Unix seqpacket"}[typ]
		if kind == "" {
			return CauseUnknown, ""
		}
		peerIno, err := unixPeerInode(uint32(ino))
		if err == nil {
			if peerIno == 0 || treeInodes[uint64(peerIno)] {
				return CauseUnknown, ""
			}
			return CauseExternalUnix, fmt.Sprintf("%s socket connected to socket:[%d]%s outside the process tree", kind, peerIno, peerDesc(fd))
		}
		// No sock_diag (other network namespace, old kernel): go by the
		// credentials the peer had when the connection was made.
		if _, perr := unix.Getpeername(fd); perr != nil {
			return CauseUnknown, "" // not connected
		}
		cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil || cred.Pid == 0 || inTree[int(cred.Pid)] {
			return CauseUnknown, ""
		}
		return CauseExternalUnix, fmt.Sprintf("%s socket connected to a peer outside the process tree%s", kind, peerDesc(fd))
	}
	return CauseUnknown, ""
}

func peerDesc(fd int) string {
	var parts []string
	if sa, err := unix.Getpeername(fd); err == nil {
		if u, ok := sa.(*unix.SockaddrUnix); ok && u.Name != "" {
			name := u.Name
			if name[0] == 0 || name[0] == '@' {
				name = "@" + strings.TrimLeft(name, "@\x00")
			}
			parts = append(parts, name)
		}
	}
	if cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil && cred.Pid > 0 {
		c := "pid " + strconv.Itoa(int(cred.Pid))
		if st, err := readProcStat(int(cred.Pid)); err == nil {
			c += " " + strconv.Quote(st.Comm)
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// peerAddr returns an IP socket's remote address (invalid if none).
func peerAddr(fd int) netip.AddrPort {
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return netip.AddrPort{}
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

func sockAddr(sa unix.Sockaddr, err error) string {
	if err != nil {
		return ""
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)).String()
	}
	return ""
}

func describe(proto, local, peer, state string) string {
	s := proto + " " + local
	if peer != "" {
		s += " -> " + peer
	}
	return s + " " + state
}

// unixPeerInode asks sock_diag for the peer of the Unix socket with inode
// ino (0: not connected).
func unixPeerInode(ino uint32) (uint32, error) {
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, err
	}
	defer unix.Close(nl)
	if err := unix.Bind(nl, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	const (
		sockDiagByFamily = 20
		udiagShowPeer    = 0x4
		unixDiagPeer     = 2
	)
	req := make([]byte, unix.SizeofNlMsghdr+24)
	le := binary.NativeEndian // netlink speaks host byte order
	le.PutUint32(req[0:], uint32(len(req)))
	le.PutUint16(req[4:], sockDiagByFamily)
	le.PutUint16(req[6:], unix.NLM_F_REQUEST)
	le.PutUint32(req[8:], 1)
	b := req[unix.SizeofNlMsghdr:]
	b[0] = unix.AF_UNIX
	le.PutUint32(b[4:], 0xffffffff) // all states
	le.PutUint32(b[8:], ino)
	le.PutUint32(b[12:], udiagShowPeer)
	le.PutUint32(b[16:], 0xffffffff) // no cookie
	le.PutUint32(b[20:], 0xffffffff)
	if err := unix.Sendto(nl, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(nl, buf, 0)
	if err != nil {
		return 0, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR {
			if len(m.Data) >= 4 {
				if e := int32(le.Uint32(m.Data)); e != 0 {
					return 0, unix.Errno(-e)
				}
			}
			return 0, errors.New("sock_diag error")
		}
		if m.Header.Type != sockDiagByFamily || len(m.Data) < 16 {
			continue
		}
		if le.Uint32(m.Data[4:]) != ino {
			continue
		}
		attrs := m.Data[16:]
		for len(attrs) >= 4 {
			alen := int(le.Uint16(attrs))
			atype := le.Uint16(attrs[2:])
			if alen < 4 || alen > len(attrs) {
				break
			}
			if atype == unixDiagPeer && alen >= 8 {
				return le.Uint32(attrs[4:]), nil
			}
			step := (alen + 3) &^ 3
			if step > len(attrs) {
				break
			}
			attrs = attrs[step:]
		}
		return 0, nil
	}
	return 0, errors.New("no sock_diag answer")
}
