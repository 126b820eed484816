// Command lazybench drives package criu for lazy-restore tests and
// measurements (root only).
//
//	lazybench restore -images DIR -work DIR [-lazy [-stop]]
//
// restores an image (lazily with -lazy), prints
// "pid <restored pid> lazy <daemon pid> log <daemon log>" and exits at once,
// leaving the lazy-pages daemon running on its own. -stop sends the daemon
// SIGSTOP first (a test's way to be sure it outlives its caller; SIGCONT
// it).
//
//	lazybench bench -heap BIN [-mb 64,256,1024] [-runs 5] [-dir /var/tmp]
//
// for each heap size, starts BIN (test/apps/lazyheap) detached, dumps it
// (killing it), then restores it -runs times plainly and -runs times lazily,
// alternating, and prints medians of: the time until Restore returns, until
// the process answers a first request, and until it answers a checksum of
// its whole heap (all measured from the start of the restore), the time
// the lazy-pages daemon takes to start (alone) and until it exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/internal/testkit/heaptest"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fatal(errors.New("usage: lazybench restore|bench [flags]"))
	}
	switch os.Args[1] {
	case "restore":
		restoreCmd(os.Args[2:])
	case "bench":
		benchCmd(os.Args[2:])
	default:
		fatal(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func restoreCmd(args []string) {
	fs := flag.NewFlagSet("restore", flag.ExitOnError)
	images := fs.String("images", "", "images directory")
	work := fs.String("work", "", "work directory")
	lazy := fs.Bool("lazy", false, "lazy restore")
	stop := fs.Bool("stop", false, "SIGSTOP the lazy-pages daemon before exiting")
	fs.Parse(args)
	criuPath, err := criu.Find("")
	if err != nil {
		fatal(err)
	}
	res, err := criu.Restore(context.Background(), criuPath, criu.RestoreOptions{ImagesDir: *images, WorkDir: *work, LazyPages: *lazy})
	if err != nil {
		fatal(err)
	}
	if res.Lazy != nil {
		if *stop {
			syscall.Kill(res.Lazy.PID, syscall.SIGSTOP)
		}
		fmt.Printf("pid %d lazy %d log %s\n", res.PID, res.Lazy.PID, res.Lazy.LogPath)
	} else {
		fmt.Printf("pid %d lazy 0 log -\n", res.PID)
	}
}

// bench state, for cleanup on failure or interruption.
var (
	live    = map[int]bool{} // processes we started or restored
	heapBin string           // their binary
	heapPID = map[int]bool{} // their original PIDs, which restores reuse
	tmpRoot string
	ctx     context.Context // cancelled by SIGINT/SIGTERM
)

func benchCmd(args []string) {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	heapFlag := fs.String("heap", "", "lazyheap binary")
	sizes := fs.String("mb", "64,256,1024", "heap sizes in MiB")
	runs := fs.Int("runs", 5, "restores per mode and size")
	dir := fs.String("dir", "/var/tmp", "where to put images (deleted afterwards)")
	fs.Parse(args)
	if heapBin = *heapFlag; heapBin == "" {
		fatal(errors.New("bench needs -heap"))
	}
	var stop context.CancelFunc
	ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	criuPath, err := criu.Find("")
	if err != nil {
		fatal(err)
	}
	// Restored trees are re-parented to us once criu exits: reap them at
	// once instead of waiting for PID 1.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fatal(fmt.Errorf("PR_SET_CHILD_SUBREAPER: %w", err))
	}
	if tmpRoot, err = os.MkdirTemp(*dir, "kcr-bench-lazy-"); err != nil {
		fatal(err)
	}
	defer cleanup()

	var rows []row
	for _, s := range strings.Split(*sizes, ",") {
		mb, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fatal(fmt.Errorf("-mb %q: %w", s, err))
		}
		r, err := benchSize(criuPath, heapBin, mb, *runs)
		if err != nil {
			cleanup() // cancelled restores kill what they restored
			fatal(err)
		}
		rows = append(rows, r)
	}
	printTable(rows, *runs)
}

type sample struct {
	restore, first, sum time.Duration
	sumInside           time.Duration // the checksum's own time, inside the process
	daemon              time.Duration // lazy: until the daemon exited
}

type row struct {
	mb          int
	rss, image  int64         // bytes
	daemonStart time.Duration // median time for StartLazyPages alone
	plain       []sample
	lazy        []sample
}

func benchSize(criuPath, heapBin string, mb, runs int) (row, error) {
	r := row{mb: mb}
	sizeDir := filepath.Join(tmpRoot, fmt.Sprintf("%dmb", mb))
	img := filepath.Join(sizeDir, "img")
	if err := os.MkdirAll(img, 0o755); err != nil {
		return r, err
	}
	fmt.Fprintf(os.Stderr, "%d MiB: filling the heap...\n", mb)
	pid, addr, err := startHeap(heapBin, mb, sizeDir)
	if err != nil {
		return r, err
	}
	want, _, err := sum(addr)
	if err != nil {
		return r, err
	}
	if r.rss, err = vmRSS(pid); err != nil {
		return r, err
	}
	dres, err := criu.Dump(ctx, criuPath, criu.DumpOptions{PID: pid, ImagesDir: img})
	if err != nil {
		return r, err
	}
	reap(pid)
	if r.image, err = dirSize(img); err != nil {
		return r, err
	}
	fmt.Fprintf(os.Stderr, "%d MiB: RSS %s, dumped in %v, image %s\n", mb, mib(r.rss), dres.Duration.Round(time.Millisecond), mib(r.image))

	// The lazy-pages daemon's fixed cost: start it alone.
	var starts []sample
	for i := 0; i < 3; i++ {
		work := filepath.Join(sizeDir, fmt.Sprintf("start-%d", i))
		if err := os.Mkdir(work, 0o755); err != nil {
			return r, err
		}
		t0 := time.Now()
		d, err := criu.StartLazyPages(ctx, criuPath, criu.LazyPagesOptions{ImagesDir: img, WorkDir: work})
		if err != nil {
			return r, err
		}
		starts = append(starts, sample{restore: time.Since(t0)})
		d.Kill()
		<-d.Done()
		os.RemoveAll(work)
	}
	r.daemonStart = median(starts, func(s sample) time.Duration { return s.restore })

	for i := 0; i < runs; i++ {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, lazy := range order {
			s, err := restoreOnce(criuPath, img, filepath.Join(sizeDir, fmt.Sprintf("work-%d-%v", i, lazy)), addr, want, lazy)
			if err != nil {
				return r, fmt.Errorf("%d MiB, run %d, lazy=%v: %w", mb, i, lazy, err)
			}
			mode := "plain"
			if lazy {
				mode = "lazy "
				r.lazy = append(r.lazy, s)
			} else {
				r.plain = append(r.plain, s)
			}
			fmt.Fprintf(os.Stderr, "%d MiB run %d %s: restore %v, first answer %v, full checksum %v (%v inside)",
				mb, i, mode, ms(s.restore), ms(s.first), ms(s.sum), ms(s.sumInside))
			if lazy {
				fmt.Fprintf(os.Stderr, ", daemon done %v", ms(s.daemon))
			}
			fmt.Fprintln(os.Stderr)
		}
	}
	os.RemoveAll(sizeDir)
	return r, nil
}

func restoreOnce(criuPath, img, work, addr, want string, lazy bool) (sample, error) {
	var s sample
	if err := os.MkdirAll(work, 0o755); err != nil {
		return s, err
	}
	defer os.RemoveAll(work)
	if err := criu.CheckImagePIDsFree(ctx, img, 5*time.Second); err != nil {
		return s, err
	}
	t0 := time.Now()
	res, err := criu.Restore(ctx, criuPath, criu.RestoreOptions{ImagesDir: img, WorkDir: work, LazyPages: lazy})
	if err != nil {
		return s, err
	}
	s.restore = time.Since(t0)
	live[res.PID] = true
	defer reap(res.PID)
	if res.Lazy != nil {
		defer res.Lazy.Kill() // only if something below failed
	}
	if line, err := ask(addr, "ping"); err != nil || !strings.HasPrefix(line, "pong ") {
		return s, fmt.Errorf("ping: %q, %v", line, err)
	}
	s.first = time.Since(t0)
	got, inside, err := sum(addr)
	if err != nil {
		return s, err
	}
	s.sum = time.Since(t0)
	s.sumInside = inside
	if got != want {
		return s, fmt.Errorf("heap checksum %s after restore, %s before", got, want)
	}
	if res.Lazy != nil {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := res.Lazy.Wait(wctx); err != nil {
			return s, fmt.Errorf("lazy-pages daemon: %w", err)
		}
		s.daemon = time.Since(t0)
		st, err := criu.ReadLazyPagesStats(res.Lazy.LogPath)
		if err != nil {
			return s, err
		}
		if st.Copied != st.Total {
			return s, fmt.Errorf("lazy-pages daemon copied %d of %d pages", st.Copied, st.Total)
		}
	}
	return s, nil
}

// startHeap starts lazyheap with a heap of mb MiB (seed mb).
func startHeap(bin string, mb int, dir string) (int, string, error) {
	h, err := heaptest.Start(ctx, bin, dir, mb, uint64(mb))
	if err != nil {
		return 0, "", err
	}
	live[h.PID] = true
	heapPID[h.PID] = true
	return h.PID, h.Addr, ctx.Err()
}

func ask(addr, cmd string) (string, error) {
	return (&heaptest.Heap{Addr: addr}).Ask(ctx, cmd)
}

// sum asks for the heap checksum and fails unless every page is right.
func sum(addr string) (string, time.Duration, error) {
	s, _, took, err := (&heaptest.Heap{Addr: addr}).Sum(ctx)
	return s, took, err
}

// reap kills pid (our child: we are a subreaper) and waits for it.
func reap(pid int) {
	syscall.Kill(pid, syscall.SIGKILL)
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		// Not our child after all: wait until PID 1 has reaped it.
		criu.WaitGone(context.Background(), pid, 10*time.Second)
	}
	delete(live, pid)
}

func cleanup() {
	for pid := range live {
		reap(pid)
	}
	// A restore cancelled late may still bring the tree back: give it a
	// moment, and kill it if it is ours.
	for pid := range heapPID {
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
				break
			}
			if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.Contains(string(b), heapBin) {
				reap(pid)
				break
			}
		}
	}
	if tmpRoot != "" {
		os.RemoveAll(tmpRoot)
	}
}

func vmRSS(pid int) (int64, error) {
	st, err := procfs.ReadStatus(pid)
	if err != nil {
		return 0, err
	}
	return st.RSSBytes, nil
}

// dirSize sums the images (logs and stats excluded).
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".img") {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	return n, err
}

func median(ss []sample, f func(sample) time.Duration) time.Duration {
	v := make([]time.Duration, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func printTable(rows []row, runs int) {
	fmt.Printf("\nmedians of %d runs per mode (plain = criu restore; lazy = criu lazy-pages + restore --lazy-pages), times from the start of the restore; ratio = lazy/plain\n\n", runs)
	fmt.Printf("%-8s %-11s %-11s %-7s | %-27s | %-27s | %-27s | %-19s | %-9s %s\n",
		"heap", "RSS", "image", "img/RSS", "restore returns", "first answer (ping)", "full-heap checksum", "checksum inside", "daemon", "daemon")
	fmt.Printf("%-8s %-11s %-11s %-7s | %-9s %-9s %-7s | %-9s %-9s %-7s | %-9s %-9s %-7s | %-9s %-9s | %-9s %s\n",
		"", "", "", "", "plain", "lazy", "ratio", "plain", "lazy", "ratio", "plain", "lazy", "ratio", "plain", "lazy", "start", "exits")
	for _, r := range rows {
		f := func(get func(sample) time.Duration) (string, string, string) {
			p, l := median(r.plain, get), median(r.lazy, get)
			return ms(p), ms(l), fmt.Sprintf("%.2f", float64(l)/float64(p))
		}
		rp, rl, rr := f(func(s sample) time.Duration { return s.restore })
		fp, fl, fr := f(func(s sample) time.Duration { return s.first })
		sp, sl, sr := f(func(s sample) time.Duration { return s.sum })
		ip, il, _ := f(func(s sample) time.Duration { return s.sumInside })
		fmt.Printf("%-8s %-11s %-11s %-7.2f | %-9s %-9s %-7s | %-9s %-9s %-7s | %-9s %-9s %-7s | %-9s %-9s | %-9s %s\n",
			fmt.Sprintf("%d MiB", r.mb), mib(r.rss), mib(r.image), float64(r.image)/float64(r.rss),
			rp, rl, rr, fp, fl, fr, sp, sl, sr, ip, il, ms(r.daemonStart), ms(median(r.lazy, func(s sample) time.Duration { return s.daemon })))
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "lazybench:", err)
	os.Exit(1)
}
