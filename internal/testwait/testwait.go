// Package testwait polls a condition in tests, for states that have no
// signal to wait on.
package testwait

import (
	"testing"
	"time"
)

// For polls cond every 10 ms until it holds, and fails t after d.
func For(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
