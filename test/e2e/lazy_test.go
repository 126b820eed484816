package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/heaptest"
)

// kcr restore --lazy of a 256 MiB heap: the heap's content is intact.
func TestLazyRestoreHeap(t *testing.T) {
	need(t)
	dir := t.TempDir()
	bin := filepath.Join(binDir, "lazyheap")
	if out, err := exec.Command("go", "build", "-o", bin, "../apps/lazyheap").CombinedOutput(); err != nil {
		t.Fatalf("build lazyheap: %v\n%s", err, out)
	}
	ctx := context.Background()
	h, err := heaptest.Start(ctx, bin, dir, 256, 7)
	if err != nil {
		t.Fatal(err)
	}
	pid := h.PID
	t.Cleanup(func() { killWait(pid) })
	sum0, pages, _, err := h.Sum(ctx)
	if err != nil || pages != 256<<8 {
		t.Fatalf("before: sum %s pages %d: %v", sum0, pages, err)
	}

	img := filepath.Join(dir, "img")
	// lazyheap closes its end of our connection a moment after we do; until
	// then the socket is in CLOSE-WAIT, which kcr rightly refuses to dump.
	for i := 0; ; i++ {
		r := runKCR(t, kcrOpts{log: logAll}, "checkpoint", "--no-hooks", "-o", img, strconv.Itoa(pid))
		if r.code == 0 {
			break
		}
		if i == 20 || !strings.Contains(r.stderr, "close-wait") {
			t.Fatalf("checkpoint: exit %d: %s", r.code, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rpid, _ := restore(t, img, "--lazy")
	if rpid != pid {
		t.Fatalf("restored as %d, want %d", rpid, pid)
	}
	sum1, _, took, err := h.Sum(ctx)
	if err != nil {
		t.Fatalf("after a lazy restore: %v", err)
	}
	if sum1 != sum0 {
		t.Fatalf("after a lazy restore: sum %s, was %s", sum1, sum0)
	}
	t.Logf("256 MiB heap intact after lazy restore (full pass %v inside the process)", took)
}
