// Package wait polls a condition in tests, for states that have no
// signal to wait on.
package wait

import (
	"testing"
	"time"
)

// For polls cond every 10 ms until it holds, and fails t after d.
func For(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// Until polls cond every 10 ms until it holds or d has passed, and reports
// whether it held: for a caller whose failure message needs more than For's
// (a log, the last value seen).
func Until(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
