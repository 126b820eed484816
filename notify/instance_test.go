package notify

import (
	"testing"
	"time"
)

// The instance key changes when the PID or the time namespace does, or
// when the process's CPU time goes back (a restored copy's starts again
// from zero, even where the kernel reuses the PID and the namespace's
// number), and stays otherwise.
func TestInstanceKeyChanges(t *testing.T) {
	links := map[string]string{"/proc/self": "100", "/proc/self/ns/time": "time:[1]"}
	cpu := 50 * time.Millisecond
	k := &instanceKeyer{
		readlink: func(p string) (string, error) { return links[p], nil },
		cpu:      func() time.Duration { return cpu },
	}
	key := func() uint64 {
		t.Helper()
		v, err := k.key()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	first := key()
	cpu += 10 * time.Millisecond
	if key() != first {
		t.Fatal("the key changed with nothing restored")
	}
	cpu = 5 * time.Millisecond // restored: the same PID and namespace number
	restored := key()
	if restored == first {
		t.Fatal("the key did not change when the CPU time went back")
	}
	cpu += time.Millisecond
	if key() != restored {
		t.Fatal("the restored copy's key changed again")
	}
	links["/proc/self/ns/time"] = "time:[2]"
	if key() == restored {
		t.Fatal("the key did not change with the time namespace")
	}
	links["/proc/self"] = "200"
	if v := key(); v == restored || v == first {
		t.Fatal("the key did not change with the PID")
	}
}
