package notify

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/notify/proto"
)

// TestNewPeerNamed: a peer outside our PID namespace (SO_PEERCRED PID 0) is
// watched through the PID it names only if /proc shows that process with
// the peer's uid, and either the peer's pidfd names the same PID or (no
// pidfd) /proc shows it with the start time it names.
func TestNewPeerNamed(t *testing.T) {
	pid, start, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Geteuid())
	self, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(self)
	for _, c := range []struct {
		name  string
		cred  unix.Ucred
		m     proto.Message
		pidfd int
		want  int
	}{
		{"named", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: pid, KCRStart: start}, -1, pid},
		{"not named", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{}, -1, 0},
		{"other start time", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: pid, KCRStart: start + 1}, -1, 0},
		{"other uid", unix.Ucred{Pid: 0, Uid: uid + 1}, proto.Message{KCRPID: pid, KCRStart: start}, -1, 0},
		{"no such process", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: 1 << 30, KCRStart: start}, -1, 0},
		{"visible peer", unix.Ucred{Pid: int32(pid), Uid: uid}, proto.Message{KCRPID: 1, KCRStart: 7}, -1, pid},
		// A pidfd of the peer vouches for the PID it named: the start time
		// it named may be read in another time namespace (a restored copy).
		{"pidfd, other start time", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: pid, KCRStart: start + 1}, self, pid},
		{"pidfd of another PID", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: os.Getppid(), KCRStart: start}, self, 0},
		{"pidfd, other uid", unix.Ucred{Pid: 0, Uid: uid + 1}, proto.Message{KCRPID: pid, KCRStart: start}, self, 0},
	} {
		p := newPeer(&c.cred, c.m, c.pidfd)
		if p.pid != c.want {
			t.Errorf("%s: peer %+v, want pid %d", c.name, p, c.want)
		}
	}
}

// TestNewPeerExited: a pidfd whose process exited (a zombie: its PID and
// start time still read) vouches for nothing.
func TestNewPeerExited(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid := cmd.Process.Pid
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if p := newPeer(&unix.Ucred{Pid: 0, Uid: uint32(os.Geteuid())}, proto.Message{KCRPID: pid}, pidfd); p.watchable() {
		t.Errorf("an exited process was taken for kcr: %+v", p)
	}
}

// TestIdentifyPeerPIDFD: over a real connection from outside our PID
// namespace (SO_PEERCRED PID 0), the peer's pidfd (SO_PEERPIDFD) vouches
// for the PID it names, whatever start time it names.
func TestIdentifyPeerPIDFD(t *testing.T) {
	pid, start, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cred := &unix.Ucred{Pid: 0, Uid: uint32(os.Geteuid())}
	if p := identifyPeer(c, cred, proto.Message{KCRPID: pid, KCRStart: start + 1}); p.pid != pid {
		t.Errorf("peer %+v, want pid %d (vouched for by its pidfd)", p, pid)
	}
	if p := identifyPeer(c, cred, proto.Message{KCRPID: os.Getppid(), KCRStart: start}); p.watchable() {
		t.Errorf("peer %+v: a PID other than the peer's was taken", p)
	}
}

// TestPeerGone: gone tells a live peer from one that exited, a zombie
// included.
func TestPeerGone(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := peer{pid: cmd.Process.Pid}
	if p.gone() {
		t.Fatal("a running process is gone")
	}
	cmd.Process.Kill()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if !p.gone() {
		t.Error("a zombie is not gone")
	}
	cmd.Wait()
	if !p.gone() {
		t.Error("a reaped process is not gone")
	}
}
