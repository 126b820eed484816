package standby

import (
	"bufio"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A moved image (a volume that follows its pod to another node) may meet
// a CPU without features its process picked up where it was dumped (Go's
// runtime and libraries choose AVX2 or AVX-512 code once, at start): it
// would die of SIGILL later. Each image records the dumping machine's CPU
// flags and kernel; a restore onto a CPU that lacks any of the flags is
// refused. The check is kcr's (a subset of /proc/cpuinfo's flags), not
// CRIU's cpuinfo image: it needs no CRIU option, applies to an image
// prepared ahead, and names the missing features.

// cpuFlags are this machine's CPU features, sorted: /proc/cpuinfo's
// "flags" (x86) or "Features" (arm64) of its first CPU.
func cpuFlags() []string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseCPUFlags(f)
}

func parseCPUFlags(f io.Reader) []string {
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if k = strings.TrimSpace(k); k == "flags" || k == "Features" {
			fl := strings.Fields(v)
			slices.Sort(fl)
			return slices.Compact(fl)
		}
	}
	return nil
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// missingCPUFlags lists the flags of image that here lacks. An image
// without a record (an older kcr's) misses nothing.
func missingCPUFlags(image, here []string) []string {
	if len(here) == 0 {
		return nil // unknown here: not refused on a guess
	}
	var out []string
	for _, f := range image {
		if _, ok := slices.BinarySearch(here, f); !ok {
			out = append(out, f)
		}
	}
	return out
}
