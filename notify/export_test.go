package notify

import (
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// Test seams, compiled only into this package's tests.

// WithInstanceFunc replaces what names the process instance (instanceKey),
// so that a test can fake the restore of the process, which otherwise needs
// CRIU.
func WithInstanceFunc(f func(pid int) (uint64, error)) Opt {
	return serverOpt{func(c *serverConfig) { c.instance = f }}
}

// WithHostPIDFunc replaces the host PID reader, so that a test can fake the
// new PID of a restored copy, which moves its control socket.
func WithHostPIDFunc(f func() int) Opt {
	return serverOpt{func(c *serverConfig) { c.hostPID = f }}
}

// WithPollEvery sets how often a waiting checkpoint polls the start time.
func WithPollEvery(d time.Duration) Opt {
	return serverOpt{func(c *serverConfig) { c.pollEvery = d }}
}

func ParseStartTime(b []byte) (uint64, error) {
	st, err := procfs.ParseStat(b)
	if err != nil {
		return 0, err
	}
	return st.StartTime, nil
}

const HookGrace = hookGrace

// InstanceKey is instanceKey.
func InstanceKey() (uint64, error) { return instanceKey(0) }

// PeerGone is gone of a peer with PID pid.
func PeerGone(pid int) bool { return peer{pid: pid}.gone() }
