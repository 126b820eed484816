package notify

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
// it, which lets a restored process notice that it is a new instance. It
// is polled while kcr dumps the process, so it opens no file: an fd open
// at the freeze on /proc/<pid>/stat is in the image, and the restore fails
// on it where that PID's directory does not exist (the soak hit that once
// in about 400 cycles when the start time was read). It combines what
// changes at a restore and reads without a file:
//   - the PID in /proc (readlink): new for a copy in a PID namespace of its
//     own; CRIU gives a copy outside one its old PID;
//   - the time namespace (readlink): CRIU restores every tree into a new
//     one, though the kernel may hand out the inode number of the dumped
//     process's, freed with it;
//   - the process's CPU time going back: it starts again from zero in the
//     restored tasks, where it only grows in a live process.
//
// Without time namespaces (Linux before 5.6) the start time is the key.
func instanceKey(int) (uint64, error) { return selfKey.key() }

var selfKey = &instanceKeyer{
	readlink: os.Readlink,
	cpu: func() time.Duration {
		var ts unix.Timespec
		if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
			return 0
		}
		return time.Duration(ts.Nano())
	},
}

// instanceKeyer computes instanceKey; its fields are seams for tests.
type instanceKeyer struct {
	readlink func(string) (string, error)
	cpu      func() time.Duration

	mu      sync.Mutex
	lastCPU time.Duration // at the last call: in the image, for the copy
	epoch   uint64        // counts the times the CPU time went back
}

func (k *instanceKeyer) key() (uint64, error) {
	k.mu.Lock()
	cpu := k.cpu() // under mu: a value read before another call's is not news
	if cpu < k.lastCPU {
		k.epoch++
	}
	k.lastCPU = cpu
	epoch := k.epoch
	k.mu.Unlock()
	pid, err := k.readlink("/proc/self")
	if err != nil {
		return 0, err
	}
	tns, err := k.readlink("/proc/self/ns/time")
	if err != nil {
		_, st, err := procfs.Self()
		return st, err
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%d", pid, tns, epoch)
	return h.Sum64(), nil
}

// Self returns this process's PID as /proc shows it and its start time:
// what another process sharing that /proc watches to tell whether this one
// still runs (kcr sends them in its checkpoint request).
func Self() (pid int, start uint64, err error) { return procfs.Self() }

// hostPID returns this process's PID as seen by /proc (procfs.SelfPID).
func hostPID() int { return procfs.SelfPID() }
