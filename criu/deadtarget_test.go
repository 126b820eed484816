package criu

import (
	"os/exec"
	"testing"
	"time"
)

// A dump whose target died is given deadTargetGrace, then CRIU is killed;
// while the target lives, CRIU is left alone however long it takes.
func TestWatchDeadTarget(t *testing.T) {
	old := deadTargetGrace
	deadTargetGrace = 300 * time.Millisecond
	defer func() { deadTargetGrace = old }()

	start := func(name string, args ...string) *exec.Cmd {
		c := exec.Command(name, args...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	target := start("sleep", "60")
	fakeCRIU := start("sleep", "60")
	stop := make(chan struct{})
	defer close(stop)
	killed := watchDeadTarget(target.Process.Pid, fakeCRIU.Process, stop)
	time.Sleep(time.Second)
	if killed.Load() {
		t.Fatal("CRIU killed while its target lives")
	}
	target.Process.Kill() // a zombie until reaped: dead all the same
	done := make(chan error, 1)
	go func() { done <- fakeCRIU.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("CRIU not killed after its target died")
	}
	if !killed.Load() {
		t.Error("killed not reported")
	}
}
