package notify_test

import (
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
)

// TestCloseRacesSocketMove: Close racing the post-restore move of the
// control socket (a restored copy with a new host PID) must neither hang nor
// leave a socket file behind. Each round fakes a restore under a new PID and
// closes the server at a random moment around the move.
func TestCloseRacesSocketMove(t *testing.T) {
	rounds := 100
	if testing.Short() {
		rounds = 20
	}
	for i := range rounds {
		dir := t.TempDir()
		st := newFakeStart()
		var moved atomic.Bool
		pid := func() int {
			if moved.Load() {
				return 4_000_000 + i
			}
			return os.Getpid()
		}
		g := notify.NewRegistry()
		g.Register("a", notify.Func(nil, nil))
		s, err := g.Start(notify.WithSocketPath(filepath.Join(dir, "kcr-test.sock")),
			notify.WithInstanceFunc(st.read), notify.WithHostPIDFunc(pid),
			notify.WithPollEvery(100*time.Microsecond), notify.WithRestoreGrace(time.Minute),
			notify.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Checkpoint(ctx(t), s.Path(), client.CheckpointRequest{HookBudget: time.Second, ResumeAfter: time.Minute}); err != nil {
			t.Fatal(err)
		}
		moved.Store(true)
		st.restore()
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		done := make(chan error, 1)
		go func() { done <- s.Close() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Close hangs after racing the socket move", i)
		}
		// The old path stays by design (a sibling clone may own it now);
		// the moved one must go with Close.
		if left, _ := filepath.Glob(filepath.Join(dir, "kcr-test-*.sock")); len(left) > 0 {
			t.Fatalf("round %d: moved socket left after Close: %v", i, left)
		}
	}
}
