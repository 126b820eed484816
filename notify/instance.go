package notify

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// newInstanceID draws 128 bits from the kernel. crypto/rand reads getrandom
// on every call, so a restored copy never repeats its image's values, unlike
// a userspace PRNG whose state is part of the image.
func newInstanceID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("notify: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// startTime returns the task's start time (procfs.Self). CRIU recreates
// every task at restore, so this value changes, which lets a restored
// process notice that it is a new instance.
func startTime(int) (uint64, error) {
	_, st, err := procfs.Self()
	return st, err
}

// Self returns this process's PID as /proc shows it and its start time:
// what another process sharing that /proc watches to tell whether this one
// still runs (kcr sends them in its checkpoint request).
func Self() (pid int, start uint64, err error) { return procfs.Self() }

// hostPID returns this process's PID as seen by /proc (procfs.SelfPID).
func hostPID() int { return procfs.SelfPID() }
