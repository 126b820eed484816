package notify

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"

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

// instanceKey names this process instance, and changes when CRIU restores
// it, which lets a restored process notice that it is a new instance: it
// hashes this process's PID in /proc (a restored copy in a PID namespace of
// its own has a new one) and its time namespace (CRIU restores every tree
// into a new one). Both are read with readlink, which opens no file: the
// key is polled while kcr dumps the process, and an fd open at the freeze
// on /proc/<pid>/stat is in the image, where a restore fails on it (that
// PID's directory is gone). The soak hit that once in about 400 cycles
// when the start time was read instead. Without time namespaces, the
// start time (procfs.Self) is the key.
func instanceKey(int) (uint64, error) {
	pid, err := os.Readlink("/proc/self")
	if err != nil {
		return 0, err
	}
	tns, err := os.Readlink("/proc/self/ns/time")
	if err != nil {
		_, st, err := procfs.Self()
		return st, err
	}
	h := fnv.New64a()
	h.Write([]byte(pid + "/" + tns))
	return h.Sum64(), nil
}

// Self returns this process's PID as /proc shows it and its start time:
// what another process sharing that /proc watches to tell whether this one
// still runs (kcr sends them in its checkpoint request).
func Self() (pid int, start uint64, err error) { return procfs.Self() }

// hostPID returns this process's PID as seen by /proc (procfs.SelfPID).
func hostPID() int { return procfs.SelfPID() }
