package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ScrubSelfEnv overwrites, with NUL bytes, the value of each variable keys
// names in the environment the process was started with: the memory
// /proc/<pid>/environ shows for as long as the process lives, which
// os.Unsetenv does not touch (Go keeps its own copy of the environment).
// It reports whether any was found. Only what a process's own environment
// held at its execve is there; call it before anything can read it.
func ScrubSelfEnv(keys ...string) (bool, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return false, err
	}
	start, end, err := envBounds(b)
	if err != nil {
		return false, err
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Errorf("scrub environment: %w", err)
	}
	defer mem.Close()
	env := make([]byte, end-start)
	if _, err := mem.ReadAt(env, int64(start)); err != nil {
		return false, fmt.Errorf("scrub environment: read: %w", err)
	}
	found := false
	off := 0
	for _, kv := range bytes.Split(env, []byte{0}) {
		for _, k := range keys {
			if bytes.HasPrefix(kv, []byte(k+"=")) {
				found = true
				at := off + len(k) + 1
				if _, err := mem.WriteAt(make([]byte, len(kv)-len(k)-1), int64(start)+int64(at)); err != nil {
					return found, fmt.Errorf("scrub environment: write: %w", err)
				}
			}
		}
		off += len(kv) + 1
	}
	return found, nil
}

// envBounds returns env_start and env_end of a /proc/<pid>/stat (fields 50
// and 51, counted from 1).
func envBounds(b []byte) (uint64, uint64, error) {
	close := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[close+1:]))
	// f[0] is field 3.
	if close < 0 || len(f) < 49 {
		return 0, 0, fmt.Errorf("/proc/self/stat has no environment bounds")
	}
	start, err1 := strconv.ParseUint(f[47], 10, 64)
	end, err2 := strconv.ParseUint(f[48], 10, 64)
	if err1 != nil || err2 != nil || end < start {
		return 0, 0, fmt.Errorf("/proc/self/stat: malformed environment bounds %q %q", f[47], f[48])
	}
	return start, end, nil
}
