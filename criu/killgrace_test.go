package criu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A CRIU that never answers nor exits (a hung one; here a script that
// sleeps) is killed KillGrace after its request's context ended: the wait
// for its answer and for its exit both end.
func TestSwrkKilledAfterDeadline(t *testing.T) {
	hung := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(hung, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(g time.Duration) { KillGrace = g }(KillGrace)
	KillGrace = 200 * time.Millisecond
	for _, hangUp := range []bool{false, true} { // a restore's CRIU, a dump's
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		s, err := startSwrk(ctx, hung, true, hangUp)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.recv(0)
			s.close()
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("hang-up %v: an answer from a CRIU that sent none", hangUp)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("hang-up %v: still waiting for the hung CRIU a minute after its deadline", hangUp)
		}
		cancel()
	}
}
