package procfs

import (
	"bytes"
	"os"
	"strconv"
)

// Marked is a live process found by NamespaceInitsWith.
type Marked struct {
	PID   int
	Start uint64    // its start time (Stat.StartTime)
	UIDs  [4]uint32 // its real, effective, saved and filesystem uids
}

// NamespaceInitsWith lists the live processes, this one aside, that are
// init of their own PID namespace and whose environment holds kv
// ("NAME=value"): the copies of a service that carry a marker, restored
// ones included (CRIU restores the environment).
func NamespaceInitsWith(kv string) []Marked {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte(kv + "\x00")
	var out []Marked
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		status, err := ReadStatus(pid)
		if err != nil || !status.OwnPIDNamespace() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append(env, 0), want) {
			continue
		}
		if stat, err := ReadStat(pid); err == nil && !stat.Zombie() {
			out = append(out, Marked{PID: pid, Start: stat.StartTime, UIDs: status.UIDs})
		}
	}
	return out
}
