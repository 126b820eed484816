package main

import "testing"

// A build with -tags kcrtest stalls on KCR_TEST_STALL_*; a normal build
// ignores them (go test -tags kcrtest runs the other half).
func TestStallNeedsTag(t *testing.T) {
	t.Setenv("KCR_TEST_STALL_AFTER_HOOKS", "1ms")
	if got := testStall("KCR_TEST_STALL_AFTER_HOOKS") != nil; got != stallBuilt {
		t.Errorf("KCR_TEST_STALL_AFTER_HOOKS=1ms: stall hook set %v, want %v (kcrtest tag %v)", got, stallBuilt, stallBuilt)
	}
	t.Setenv("KCR_TEST_STALL_AFTER_HOOKS", "soon")
	if testStall("KCR_TEST_STALL_AFTER_HOOKS") != nil {
		t.Error("a stall that is not a duration set a hook")
	}
}
