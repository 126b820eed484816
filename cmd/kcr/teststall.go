//go:build !kcrtest

package main

// testStall is nil in a normal build: the KCR_TEST_STALL_* variables that
// the e2e tests use to stall kcr between phases have no effect (build with
// -tags kcrtest for them).
func testStall(string) func() { return nil }
