package criu

// Integration tests of lazy restore: they need root and CRIU (see
// integration_test.go), and userfaultfd.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/heaptest"
)

// heapTarget is a running test/apps/lazyheap.
type heapTarget struct{ *heaptest.Heap }

// startHeap starts lazyheap with a heap of mb MiB and waits until it has
// filled the heap and listens.
func startHeap(t *testing.T, mb int, seed uint64) *heapTarget {
	t.Helper()
	bin := testProgram(t, "lazyheap")
	h, err := heaptest.Start(context.Background(), bin, t.TempDir(), mb, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if strings.Contains(cmdline(h.PID), bin) {
			syscall.Kill(h.PID, syscall.SIGKILL)
			waitGone(h.PID, 10*time.Second)
		}
	})
	return &heapTarget{h}
}

// ask sends cmd to the target and returns its one-line answer.
func (h *heapTarget) ask(t *testing.T, cmd string) string {
	t.Helper()
	line, err := h.Ask(context.Background(), cmd)
	if err != nil {
		out, _ := os.ReadFile(h.Out)
		t.Fatalf("%v; output:\n%s", err, out)
	}
	return line
}

// sum asks for the heap's checksum; it fails the test if a page differs
// from the pattern.
func (h *heapTarget) sum(t *testing.T) (sum string, ms int) {
	t.Helper()
	sum, _, took, err := h.Sum(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return sum, int(took.Milliseconds())
}

func daemonsFor(workDir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c := cmdline(pid); strings.Contains(c, "lazy-pages") && strings.Contains(c, workDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// settledFDs is fdTable once the connection of the last request is closed.
func settledFDs(t *testing.T, pid int) map[string]string {
	t.Helper()
	prev := fdTable(t, pid)
	for i := 0; i < 100; i++ {
		time.Sleep(20 * time.Millisecond)
		cur := fdTable(t, pid)
		if fmt.Sprint(cur) == fmt.Sprint(prev) {
			return cur
		}
		prev = cur
	}
	return prev
}

func logTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// waitGone is WaitGone, retried when it catches the process between the
// open and the read of /proc/<pid>/stat (ESRCH: WaitGone only takes
// ENOENT for gone).
func waitGone(pid int, timeout time.Duration) error {
	var err error
	for i := 0; i < 100; i++ {
		if _, err = WaitGone(context.Background(), pid, timeout); !errors.Is(err, syscall.ESRCH) {
			return err
		}
	}
	return err
}

// dumpHeap dumps h (killing it) and waits until its PIDs are free.
func dumpHeap(t *testing.T, criu string, h *heapTarget) string {
	t.Helper()
	ctx := context.Background()
	img := mkdir(t, "img")
	// The connection of the last request (a checksum) may not be closed on
	// the heap's side yet: CRIU refuses to dump an established one.
	noOpenConns(t, h.PID)
	res, err := Dump(ctx, criu, DumpOptions{PID: h.PID, ImagesDir: img})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitGone(h.PID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := CheckImagePIDsFree(ctx, img, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("dump: %v, %d pages written", res.Duration, res.Stats.PagesWritten)
	return img
}

func TestE2ELazyRestore(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	const mb = 256
	h := startHeap(t, mb, 7)
	sumBefore, _ := h.sum(t)
	fdsBefore := settledFDs(t, h.PID)
	img := dumpHeap(t, criu, h)

	work := mkdir(t, "work")
	rr, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: work, LazyPages: true})
	if err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	d := rr.Lazy
	if d == nil {
		t.Fatal("no lazy-pages daemon in the result")
	}
	if rr.PID != h.PID {
		t.Errorf("restored PID %d, want %d", rr.PID, h.PID)
	}
	if d.LogPath != filepath.Join(work, DefaultLazyPagesLog) || d.SocketPath != filepath.Join(work, LazyPagesSocket) {
		t.Errorf("daemon %+v", d)
	}
	// The daemon: our child (while we live), in a session of its own,
	// with none of criu swrk's fds.
	if st, err := readProcStat(d.PID); err == nil {
		if st.PPID != os.Getpid() || st.Session != d.PID {
			t.Errorf("daemon: parent %d, session %d", st.PPID, st.Session)
		}
		for fd, l := range fdTable(t, d.PID) {
			if strings.Contains(l, "criu-swrk") {
				t.Errorf("daemon fd %s -> %s", fd, l)
			}
		}
	} else {
		t.Logf("daemon already gone: %v", err)
	}

	// It answers at once, and with the same memory.
	pong := h.ask(t, "ping")
	firstAnswer := time.Since(restored)
	if pong != fmt.Sprintf("pong %d", h.PID) {
		t.Errorf("ping = %q", pong)
	}
	sumAfter, ms := h.sum(t)
	fullSum := time.Since(restored)
	if sumAfter != sumBefore {
		t.Errorf("heap checksum %s after the lazy restore, %s before", sumAfter, sumBefore)
	}
	t.Logf("lazy restore of %d MiB: restore %v (restore_time %v, %d pages restored eagerly); first answer +%v; full-heap checksum +%v (%d ms inside)",
		mb, rr.Duration, rr.Stats.RestoreTime, rr.Stats.PagesRestored, firstAnswer, fullSum, ms)

	// The daemon exits by itself once every page is in.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.Wait(wctx); err != nil {
		t.Fatalf("lazy-pages daemon: %v", err)
	}
	t.Logf("daemon done %v after the restore", time.Since(restored))
	st, err := ReadLazyPagesStats(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tasks != 1 || st.Copied != st.Total || st.Total < mb<<20/4096 {
		t.Errorf("daemon stats %+v, want all of >= %d pages; log ends:\n%s", st, mb<<20/4096, logTail(d.LogPath))
	}
	if first, _ := ParseLogFile(d.LogPath); first != "" {
		t.Errorf("error in the daemon log: %s", first)
	}
	t.Logf("daemon: %+v", st)

	// The restored process lives on, unharmed, with the fds it had.
	if fdsAfter := settledFDs(t, rr.PID); fmt.Sprint(fdsAfter) != fmt.Sprint(fdsBefore) {
		t.Errorf("fds changed across dump/restore:\nbefore %v\nafter  %v", fdsBefore, fdsAfter)
	}
	time.Sleep(100 * time.Millisecond)
	h.ask(t, "ping")
	if s, _ := h.sum(t); s != sumBefore {
		t.Errorf("heap checksum %s once the daemon is gone, %s before", s, sumBefore)
	}
	if st, err := readProcStat(rr.PID); err != nil || st.State == 'Z' {
		t.Errorf("restored process: %+v, %v", st, err)
	}
}

// The program that restored lazily may exit at once: the daemon goes on.
func TestE2ELazyRestoreCallerExits(t *testing.T) {
	criu := needCRIU(t)
	h := startHeap(t, 64, 11)
	sumBefore, _ := h.sum(t)
	img := dumpHeap(t, criu, h)
	work := mkdir(t, "work")

	// lazybench restores, stops the daemon (so that it cannot be done
	// before its caller is gone), prints and exits.
	out, err := exec.Command(testProgram(t, "lazybench"), "restore", "-images", img, "-work", work, "-lazy", "-stop").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("lazybench restore: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var pid, dpid int
	var logPath string
	if _, err := fmt.Sscanf(string(out), "pid %d lazy %d log %s", &pid, &dpid, &logPath); err != nil || pid != h.PID {
		t.Fatalf("lazybench printed %q", out)
	}
	st, err := readProcStat(dpid)
	if err != nil {
		t.Fatalf("the daemon did not survive its caller: %v", err)
	}
	t.Logf("daemon %d after its caller exited: state %c, parent %d, session %d", dpid, st.State, st.PPID, st.Session)
	if st.Session != dpid {
		t.Errorf("daemon session %d", st.Session)
	}
	syscall.Kill(dpid, syscall.SIGCONT)

	if s, _ := h.sum(t); s != sumBefore {
		t.Errorf("heap checksum %s after the lazy restore, %s before", s, sumBefore)
	}
	if err := waitGone(dpid, time.Minute); err != nil {
		t.Fatalf("lazy-pages daemon: %v", err)
	}
	ls, err := ReadLazyPagesStats(logPath)
	if err != nil || ls.Tasks != 1 || ls.Copied != ls.Total {
		t.Errorf("daemon stats %+v, %v; log ends:\n%s", ls, err, logTail(logPath))
	}
	if first, _ := ParseLogFile(logPath); first != "" {
		t.Errorf("error in the daemon log: %s", first)
	}
	h.ask(t, "ping")
}

// A lazy restore that fails leaves no daemon behind.
func TestE2ELazyRestoreFails(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	tg := startTarget(t, false)
	img := mkdir(t, "img")
	if _, err := Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img, LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	work := mkdir(t, "work")
	_, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: work, LazyPages: true})
	var ce *Error
	if !errors.As(err, &ce) || ce.Cause != CausePIDInUse {
		t.Errorf("lazy restore over the running original = %v", err)
	}
	t.Logf("%v", err)
	if pids := daemonsFor(work); len(pids) != 0 {
		t.Errorf("lazy-pages daemons left running: %v", pids)
	}
	tg.waitTicks(t, tg.lastTick(t))

	// Images the daemon cannot read.
	empty := mkdir(t, "empty")
	_, err = Restore(ctx, criu, RestoreOptions{ImagesDir: empty, WorkDir: work, LazyPages: true})
	if !errors.As(err, &ce) || ce.Op != "lazy-pages" || ce.Log != filepath.Join(work, DefaultLazyPagesLog) {
		t.Errorf("lazy restore of an empty directory = %v", err)
	}
	t.Logf("%v", err)
}
