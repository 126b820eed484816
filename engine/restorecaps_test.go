package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/criu"
)

func TestMissingCaps(t *testing.T) {
	const sysAdmin, sysPtrace, sysTime, netAdmin = 21, 19, 25, 12
	bit := func(cs ...int) uint64 {
		var b uint64
		for _, c := range cs {
			b |= 1 << c
		}
		return b
	}
	root := criu.Caps{Prm: bit(sysAdmin, sysPtrace, sysTime, netAdmin), Bnd: bit(sysAdmin, sysPtrace, sysTime, netAdmin)}
	for _, c := range []struct {
		name string
		img  criu.Caps
		own  criu.Caps
		want []uintptr
	}{
		{"fewer", criu.Caps{Prm: bit(sysAdmin), Eff: bit(sysAdmin), Bnd: bit(sysAdmin)}, root, nil},
		{"same", root, root, nil},
		{"one more", criu.Caps{Prm: bit(sysAdmin, sysPtrace)}, criu.Caps{Prm: bit(sysAdmin), Bnd: bit(sysAdmin)}, []uintptr{sysPtrace}},
		// Only what capset cannot give counts: a larger bounding set is
		// not restored (CRIU only drops), an inheritable capability in
		// kcr's bounding set can be given.
		{"bounding", criu.Caps{Bnd: bit(sysAdmin, sysPtrace)}, criu.Caps{Prm: bit(sysAdmin), Bnd: bit(sysAdmin)}, nil},
		{"inheritable", criu.Caps{Inh: bit(sysTime, netAdmin)}, criu.Caps{Bnd: bit(sysTime)}, []uintptr{netAdmin}},
		// A capability this kernel does not know is CRIU's to judge.
		{"beyond last", criu.Caps{Prm: 1 << 45}, root, nil},
	} {
		if got := missingCaps(c.img, c.own, 40); !slices.Equal(got, c.want) {
			t.Errorf("%s: missingCaps = %v, want %v", c.name, got, c.want)
		}
	}
}

// A CRIU that does not answer (its restorer failed and it waits for its
// tasks, or it is stuck on a hung volume) is stopped at CRIUWait: the
// restore returns one line naming the deadline, CRIU's first error and its
// log, and the image is kept. (Without the deadline, the restore waited for
// CRIU for good.)
func TestRestoreSeamsCRIUStuck(t *testing.T) {
	f := newRestoreFixture(t, true, nil)
	f.s.restorer = restoreFunc(func(ctx context.Context, _ string, o criu.RestoreOptions) (*criu.RestoreResult, error) {
		log := filepath.Join(o.WorkDir, "restore.log")
		line := "pie: 5001: Error (criu/pie/restorer.c:347): Unable to restore capabilities: -1\n"
		if err := os.WriteFile(log, []byte(line), 0o600); err != nil {
			return nil, err
		}
		<-ctx.Done() // as criu.Restore: CRIU killed at the deadline
		return nil, &criu.Error{Op: "restore", Log: log, Err: fmt.Errorf("interrupted: %w", ctx.Err())}
	})
	done := make(chan error, 1)
	go func() {
		_, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, CRIUWait: 200 * time.Millisecond, WorkDir: t.TempDir()})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the restore still waits for its stuck CRIU 30 s after its 200ms deadline")
	}
	var ce *criu.Error
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ce) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("restore = %q", err)
	}
	for _, want := range []string{"within 200ms (--criu-wait)", "Unable to restore capabilities", ce.Log, "hint: "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	imageKept(t, f.image)
}

// restoreFunc is a restorer whose Restore is the function itself and
// whose Start starts nothing.
type restoreFunc func(ctx context.Context, criuPath string, o criu.RestoreOptions) (*criu.RestoreResult, error)

func (f restoreFunc) Start(context.Context, string, ...*os.File) (*criu.RestoreSession, error) {
	return nil, nil
}

func (f restoreFunc) Restore(ctx context.Context, criuPath string, o criu.RestoreOptions) (*criu.RestoreResult, error) {
	return f(ctx, criuPath, o)
}
