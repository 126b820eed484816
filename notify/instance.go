package notify

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
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

// startTime returns field 22 of /proc/self/stat: the task's start time in
// clock ticks after boot. CRIU recreates every task at restore, so this value
// changes, which lets a restored process notice that it is a new instance.
// It reads /proc/self, not /proc/<getpid>: in a PID namespace of its own the
// process is PID 1 there, while /proc is usually the host's.
func startTime(int) (uint64, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	return parseStartTime(b)
}

func parseStartTime(stat []byte) (uint64, error) {
	// comm (field 2) may hold spaces and parentheses; fields resume after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc stat: no ')'")
	}
	fields := bytes.Fields(stat[i+1:])
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("parse /proc stat: %d fields after comm", len(fields))
	}
	return strconv.ParseUint(string(fields[19]), 10, 64)
}

// Self returns this process's PID as /proc shows it and its start time:
// what another process sharing that /proc watches to tell whether this one
// still runs (kcr sends them in its checkpoint request).
func Self() (pid int, start uint64, err error) {
	start, err = startTime(0)
	return hostPID(), start, err
}

// hostPID returns this process's PID as seen by /proc, which is the host's
// PID when the process runs in a PID namespace of its own without a mount
// namespace (as under "kcr run"). kcr looks processes up by that PID.
func hostPID() int {
	if l, err := os.Readlink("/proc/self"); err == nil {
		if pid, err := strconv.Atoi(l); err == nil && pid > 0 {
			return pid
		}
	}
	return os.Getpid()
}
