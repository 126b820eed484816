//go:build kcrtest

package main

import (
	"os"
	"time"
)

// testStall returns a hook that sleeps for the duration in the environment
// variable env, or nil if it is unset or not a duration. The e2e tests use
// it to kill kcr between its hooks and the dump (KCR_TEST_STALL_AFTER_HOOKS),
// while CRIU waits at its post-dump stage (KCR_TEST_STALL_AT_POST_DUMP),
// between the dump and publishing the image (KCR_TEST_STALL_AFTER_DUMP), or
// to swap an image after its verification (KCR_TEST_STALL_AFTER_VERIFY).
func testStall(env string) func() {
	d, err := time.ParseDuration(os.Getenv(env))
	if err != nil {
		return nil
	}
	return func() { time.Sleep(d) }
}
