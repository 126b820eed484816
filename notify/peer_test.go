package notify

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/notify/proto"
)

// TestNewPeerNamed: a peer outside our PID namespace (SO_PEERCRED PID 0) is
// watched through the PID it names only if /proc shows that process with
// the start time it names and the peer's uid.
func TestNewPeerNamed(t *testing.T) {
	pid, start, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Geteuid())
	for _, c := range []struct {
		name string
		cred unix.Ucred
		m    proto.Message
		want int
	}{
		{"named", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: pid, KCRStart: start}, pid},
		{"not named", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{}, 0},
		{"other start time", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: pid, KCRStart: start + 1}, 0},
		{"other uid", unix.Ucred{Pid: 0, Uid: uid + 1}, proto.Message{KCRPID: pid, KCRStart: start}, 0},
		{"no such process", unix.Ucred{Pid: 0, Uid: uid}, proto.Message{KCRPID: 1 << 30, KCRStart: start}, 0},
		{"visible peer", unix.Ucred{Pid: int32(pid), Uid: uid}, proto.Message{KCRPID: 1, KCRStart: 7}, pid},
	} {
		p := newPeer(&c.cred, c.m)
		if p.pid != c.want || (c.want > 0 && p.start != start) {
			t.Errorf("%s: peer %+v, want pid %d start %d", c.name, p, c.want, start)
		}
	}
}
