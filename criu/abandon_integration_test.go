package criu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// noOpenConns waits until the connection of the last request to pid is
// gone (CRIU cannot dump it).
func noOpenConns(t *testing.T, pid int) {
	t.Helper()
	var p []Problem
	var err error
	wait.Until(10*time.Second, func() bool {
		p, err = Preflight(pid)
		return err != nil || len(p) == 0
	})
	if err != nil || len(p) != 0 {
		t.Fatalf("Preflight = %v, %v", p, err)
	}
}

// pagesWritten is the size of the pages images in dir so far.
func pagesWritten(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "pages-") {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
	}
	return n
}

// An abandonable dump cancelled while it writes pages ends long before the
// pages are all written: the tree is resumed with its memory as it was,
// running, and nothing claims to be an image.
func TestE2EAbandonableDumpCancel(t *testing.T) {
	criu := needCRIU(t)
	const mb = 1024
	h := startHeap(t, mb, 7)
	before, _ := h.sum(t)
	noOpenConns(t, h.PID)

	img := mkdir(t, "img")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := StartDumpSession(ctx, criu, SessionOptions{Abandonable: true})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := s.Begin(DumpOptions{PID: h.PID, ImagesDir: img, LogLevel: 4})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		res *DumpResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := pd.Go(ctx)
		done <- result{r, err}
	}()
	// Mid-dump: the page server has written its first pages.
	var early *result
	if !wait.Until(2*time.Minute, func() bool {
		select {
		case r := <-done:
			early = &r
			return true
		default:
		}
		return pagesWritten(img) > 0
	}) {
		ents, _ := os.ReadDir(img)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		ps, _ := exec.Command("ps", "-eo", "pid,stat,wchan:32,args").Output()
		t.Fatalf("no pages written in 2 min; images dir %v; dump log:\n%s\npage server log:\n%s\nprocesses:\n%s", names,
			logTail(filepath.Join(img, "dump.log")), logTail(filepath.Join(img, PageServerLog)), grepLines(string(ps), "criu"))
	}
	if early != nil {
		t.Fatalf("the dump ended before it wrote a page: %v", early.err)
	}
	at := pagesWritten(img)
	cancel()
	t0 := time.Now()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the cancelled dump did not end in 2 min")
	}
	took := time.Since(t0)
	if r.err == nil {
		t.Fatalf("cancelled dump succeeded (%d of %d MiB written when cancelled)", at>>20, mb)
	}
	written := pagesWritten(img)
	t.Logf("cancelled with %d MiB written, ended %v later with %d MiB written: %v", at>>20, took.Round(time.Millisecond), written>>20, r.err)
	if written >= mb<<20 {
		t.Errorf("the cancelled dump wrote all %d MiB of pages before it ended", written>>20)
	}
	// Resumed, not killed nor left stopped.
	st, err := procfs.ReadStat(h.PID)
	if err != nil {
		t.Fatalf("the dumped process is gone after the cancel: %v", err)
	}
	if st.State == 'T' || st.State == 't' || st.Zombie() {
		t.Fatalf("the dumped process is in state %c after the cancel", st.State)
	}
	if after, _ := h.sum(t); after != before {
		t.Errorf("heap sum %s after the cancel, %s before", after, before)
	}
	if _, err := os.Stat(filepath.Join(img, StatsDumpFile)); err == nil {
		t.Errorf("%s written by a cancelled dump", StatsDumpFile)
	}
}

// An abandonable dump that is not cancelled writes an image that restores
// with the same memory.
func TestE2EAbandonableDumpRestore(t *testing.T) {
	criu := needCRIU(t)
	h := startHeap(t, 64, 11)
	before, _ := h.sum(t)
	noOpenConns(t, h.PID)
	img := mkdir(t, "img")
	ctx := context.Background()
	s, err := StartDumpSession(ctx, criu, SessionOptions{Abandonable: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Dump(ctx, DumpOptions{PID: h.PID, ImagesDir: img})
	if err != nil {
		t.Fatal(err)
	}
	res.Wait()
	if res.Stats == nil || res.Stats.PagesWritten < 64<<20/4096 {
		t.Fatalf("dump stats %+v, %v: want >= %d pages written", res.Stats, res.StatsErr, 64<<20/4096)
	}
	if _, err := os.Stat(filepath.Join(img, PageServerLog)); err != nil {
		t.Errorf("no page server log: %v", err)
	}
	if err := waitGone(h.PID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	rr, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, "work")})
	if err != nil {
		t.Fatal(err)
	}
	if rr.PID != h.PID {
		t.Errorf("restored PID %d, want %d", rr.PID, h.PID)
	}
	if after, _ := h.sum(t); after != before {
		t.Errorf("heap sum %s after the restore, %s before", after, before)
	}
}

// A dump cancelled at its post-dump stage (the images written, the tree
// frozen: kcr syncs the pages there) fails, and CRIU resumes the tree
// instead of killing it.
func TestE2EAbandonableDumpCancelAtPostDump(t *testing.T) {
	criu := needCRIU(t)
	h := startHeap(t, 64, 5)
	before, _ := h.sum(t)
	noOpenConns(t, h.PID)
	img := mkdir(t, "img")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := StartDumpSession(ctx, criu, SessionOptions{Abandonable: true})
	if err != nil {
		t.Fatal(err)
	}
	var stages []string
	_, err = s.Dump(ctx, DumpOptions{PID: h.PID, ImagesDir: img, Notify: func(script string, _ int) error {
		stages = append(stages, script)
		if script == "post-dump" {
			cancel()
			return ctx.Err()
		}
		return nil
	}})
	if err == nil {
		t.Fatalf("dump cancelled at post-dump succeeded (stages %v)", stages)
	}
	if pagesWritten(img) < 64<<20 {
		t.Errorf("%d MiB of pages written at post-dump, want all 64", pagesWritten(img)>>20)
	}
	st, err := procfs.ReadStat(h.PID)
	if err != nil {
		t.Fatalf("the dumped process is gone after the cancel at post-dump: %v", err)
	}
	if st.State == 'T' || st.State == 't' || st.Zombie() {
		t.Fatalf("the dumped process is in state %c after the cancel", st.State)
	}
	if after, _ := h.sum(t); after != before {
		t.Errorf("heap sum %s after the cancel, %s before", after, before)
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
