package standby

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// takeListener takes the --listen socket back from a running copy of the
// service: a kcr standby killed while the service ran left the socket in
// the service alone (it was handed a dup), so the address is taken and a
// new socket cannot be bound; the same socket, fetched with pidfd_getfd,
// goes on queueing the connections for the service.
func takeListener(dir, addr string, uid uint32) (*net.TCPListener, error) {
	want, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	for _, p := range findCopies(dir, uid) {
		if ln, err := listenerOf(p.PID, want); err == nil {
			return ln, nil
		}
	}
	return nil, errors.New("no running copy of the service holds it")
}

// listenerOf finds, among pid's fds, the listening TCP socket bound to
// want, and returns a copy of it.
func listenerOf(pid int, want *net.TCPAddr) (*net.TCPListener, error) {
	inodes := listeningInodes(pid, want.Port)
	if len(inodes) == 0 {
		return nil, errors.New("no listening socket on that port")
	}
	fdDir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	for _, e := range ents {
		link, err := os.Readlink(fdDir + "/" + e.Name())
		if err != nil || !inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			continue
		}
		target, _ := strconv.Atoi(e.Name())
		fd, err := unix.PidfdGetfd(pidfd, target, 0)
		if err != nil {
			return nil, fmt.Errorf("pidfd_getfd %d/%d: %w", pid, target, err)
		}
		f := os.NewFile(uintptr(fd), "listen")
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			continue
		}
		tl, ok := ln.(*net.TCPListener)
		if a, aok := ln.Addr().(*net.TCPAddr); ok && aok && a.Port == want.Port && (want.IP == nil || want.IP.IsUnspecified() || a.IP.Equal(want.IP)) {
			return tl, nil
		}
		ln.Close()
	}
	return nil, errors.New("its socket is not among its fds")
}

// listeningInodes are the inodes of the TCP sockets listening on port in
// pid's network namespace.
func listeningInodes(pid, port int) map[string]bool {
	out := map[string]bool{}
	hexPort := fmt.Sprintf(":%04X", port)
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/net/" + name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) >= 10 && strings.HasSuffix(fs[1], hexPort) && fs[3] == "0A" {
				out[fs[9]] = true
			}
		}
		f.Close()
	}
	return out
}
