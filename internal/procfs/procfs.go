// Package procfs reads what kcr needs of processes from /proc: the fields
// of /proc/<pid>/stat and /proc/<pid>/status, and a process's tree. It is
// the one parser of those files for criu, notify (which must not import
// criu), client and engine. It has no dependency beyond the standard library, so that the
// small CRIU action script (cmd/kcr-hook) starts fast.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat holds the fields of /proc/<pid>/stat kcr uses.
type Stat struct {
	Comm      string
	State     byte
	PPID      int
	Pgrp      int
	Session   int
	TTYNr     int
	StartTime uint64 // clock ticks since boot
}

// ReadStat reads /proc/<pid>/stat.
func ReadStat(pid int) (*Stat, error) {
	return ReadStatPath("/proc/" + strconv.Itoa(pid) + "/stat")
}

// ReadStatPath reads a stat file by path, such as /proc/self/stat (which,
// unlike /proc/<getpid>, is right in a PID namespace of the process's own).
func ReadStatPath(path string) (*Stat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseStat(b)
}

// ParseStat parses the content of a /proc/<pid>/stat file; the command
// name may hold spaces and parentheses.
func ParseStat(b []byte) (*Stat, error) {
	open, close := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || close < open {
		return nil, fmt.Errorf("malformed /proc stat %q", b)
	}
	f := strings.Fields(string(b[close+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return nil, fmt.Errorf("malformed /proc stat %q", b)
	}
	s := &Stat{Comm: string(b[open+1 : close]), State: f[0][0]}
	ints := []*int{&s.PPID, &s.Pgrp, &s.Session, &s.TTYNr}
	for i, p := range ints {
		v, err := strconv.Atoi(f[1+i])
		if err != nil {
			return nil, fmt.Errorf("malformed /proc stat %q", b)
		}
		*p = v
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("malformed /proc stat %q", b)
	}
	s.StartTime = st
	return s, nil
}

// Zombie reports whether the state is Z (zombie) or X (dead): the process
// has exited and only waits to be reaped.
func (s *Stat) Zombie() bool { return s.State == 'Z' || s.State == 'X' }

// Self returns this process's PID as /proc shows it (SelfPID) and its start
// time. It reads /proc/self, not /proc/<getpid>: in a PID namespace of its
// own the process is PID 1, while /proc is usually the host's.
func Self() (pid int, start uint64, err error) {
	st, err := ReadStatPath("/proc/self/stat")
	if err != nil {
		return SelfPID(), 0, err
	}
	return SelfPID(), st.StartTime, nil
}

// SelfPID returns this process's PID as seen by /proc, which is the host's
// PID when the process runs in a PID namespace of its own without a mount
// namespace (as under "kcr run"). kcr looks processes up by that PID.
func SelfPID() int {
	if l, err := os.Readlink("/proc/self"); err == nil {
		if pid, err := strconv.Atoi(l); err == nil && pid > 0 {
			return pid
		}
	}
	return os.Getpid()
}

// StartTime returns the start time of process pid (field 22 of
// /proc/<pid>/stat, in clock ticks since boot): with the PID, it names one
// process, as a PID alone may be reused.
func StartTime(pid int) (uint64, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return 0, err
	}
	return st.StartTime, nil
}

// Tree returns pid and all its descendants (pid first), from
// /proc/<pid>/task/*/children. Processes that exit meanwhile are left out.
func Tree(pid int) []int {
	seen := map[int]bool{pid: true}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		p := strconv.Itoa(out[i])
		tasks, _ := os.ReadDir("/proc/" + p + "/task")
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + p + "/task/" + t.Name() + "/children")
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(c); err == nil && !seen[n] {
					seen[n] = true
					out = append(out, n)
				}
			}
		}
	}
	return out
}
