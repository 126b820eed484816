package criu

import (
	"os"
	"strings"
	"sync"
)

// inChildUserNS reports whether kcr runs in a user namespace other than
// the initial one (a pod with hostUsers: false). CRIU then runs in its
// unprivileged mode: forcing a restored socket's buffer sizes
// (SO_SNDBUFFORCE) takes CAP_NET_ADMIN in the initial namespace, which
// fails every restore of a process with a socket, and in that mode CRIU
// sets the sizes it may instead.
var inChildUserNS = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	return err == nil && !initialUIDMap(b)
})

// initialUIDMap reports whether b, a /proc/PID/uid_map, is the initial
// user namespace's: every uid mapped to itself.
func initialUIDMap(b []byte) bool {
	f := strings.Fields(string(b))
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}
