package notify_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// TestHookBudgetCapped: the app holds a request's hook budget to its own
// cap, so a CLI cannot keep its resources quiesced for an hour.
func TestHookBudgetCapped(t *testing.T) {
	g := notify.NewRegistry()
	g.Register("slow", notify.Func(func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}, nil))
	log := &syncBuffer{}
	s, err := g.Start(notify.WithSocketPath(filepath.Join(t.TempDir(), "kcr-cap.sock")), notify.WithMaxHookBudget(200*time.Millisecond),
		notify.WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	m, err := client.Checkpoint(ctx(t), s.Path(), client.CheckpointRequest{HookBudget: time.Hour, ResumeAfter: time.Minute})
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("hooks ran %v with a cap of 200ms", el)
	}
	if m.Type != proto.TypeFailed || !strings.Contains(m.Error, "deadline") {
		t.Errorf("answer = %+v, %v", m, err)
	}
	if !strings.Contains(log.String(), "clamped") {
		t.Errorf("clamp not logged:\n%s", log)
	}
}
