package criu

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Lazy restore.
//
// With RestoreOptions.LazyPages, Restore first starts "criu lazy-pages" (see
// StartLazyPages), then restores with lazy_pages=true: CRIU leaves the
// private anonymous memory empty (all but a few pages, such as the stack's),
// registers it with userfaultfd, sends the userfaultfds to the daemon over
// "lazy-pages.socket" in the work directory (both sides find the socket
// there: CRIU chdirs into its work directory and uses that relative name),
// and returns. The daemon then
// serves the restored tree's page faults from the images and, as soon as the
// restore is finished, copies the remaining pages in the background (64 KiB
// chunks growing to 4 MiB). When every page is in, it exits by itself.
//
// Images from an ordinary Dump restore lazily as they are: CRIU marks the
// pages of private anonymous mappings lazy-able in every dump. "criu dump
// --lazy-pages" is something else (post-copy migration: the dump writes no
// pages and serves them from a page server to a remote daemon) and is not
// needed for a local lazy restore.
//
// Until the daemon has exited, it owns the memory of the restored tree:
//   - do not kill it: the kernel drops the userfaultfd registration when the
//     daemon goes away, and the pages not yet copied read as zeros in the
//     restored process (a Go service killed that way crashed at once with
//     SIGSEGV; data that is only read may go wrong silently);
//   - do not delete or modify the images;
//   - the restored tree runs, but its first touch of each page costs a round
//     trip to the daemon until the background copy has caught up.

// LazyPagesSocket is the name of the socket through which a lazy restore
// hands its userfaultfds to the lazy-pages daemon, in their common work
// directory.
const LazyPagesSocket = "lazy-pages.socket"

// DefaultLazyPagesLog is the lazy-pages daemon's log file name in the work
// directory.
const DefaultLazyPagesLog = "lazy-pages.log"

// LazyPagesOptions configures StartLazyPages.
type LazyPagesOptions struct {
	ImagesDir string // images written by Dump; the daemon reads the pages from there
	// ImagesDirFile, if set, is ImagesDir already open: the daemon is
	// handed this descriptor and reads the pages through it, so that the
	// path cannot be swapped for another directory after it was verified.
	ImagesDirFile *os.File
	// WorkDir receives the daemon's socket and log; the restore must use
	// the same WorkDir. One lazy restore at a time per WorkDir: the socket
	// name is fixed. Empty means ImagesDir.
	WorkDir string
	LogFile string // log file name inside WorkDir; default DefaultLazyPagesLog
	// ReadyTimeout bounds the wait for the daemon's socket; default 10s.
	ReadyTimeout time.Duration
}

// LazyPages is a running "criu lazy-pages" daemon.
//
// The daemon runs in a session and process group of its own, with stdin
// from /dev/null and its output in a memory file, and is not tied to any
// context: the calling program may exit while it keeps serving pages (it is
// then re-parented, like the restored tree). While the program lives, it
// reaps the daemon and Wait reports how it ended.
type LazyPages struct {
	PID        int    // the daemon's PID
	LogPath    string // its log (CRIU's -o), in the work directory
	SocketPath string // lazy-pages.socket in the work directory

	cmd    *exec.Cmd
	out    *os.File // memfd with the daemon's stdout+stderr
	done   chan struct{}
	output string // what it printed; set before done is closed
	err    error  // how it ended; set before done is closed
}

// StartLazyPages starts "criu lazy-pages" for opts.ImagesDir and waits until
// it listens on its socket in opts.WorkDir (CRIU's --status-fd). Restore
// does this itself when RestoreOptions.LazyPages is set; use it directly only
// to drive a restore some other way (criu restore --lazy-pages -W <WorkDir>).
//
// The daemon accepts one restore. If none comes, it waits forever: Kill it.
// ctx only bounds the start.
func StartLazyPages(ctx context.Context, criuPath string, opts LazyPagesOptions) (*LazyPages, error) {
	imagesDir, workDir, logFile, err := lazyPagesPaths(opts)
	if err != nil {
		return nil, err
	}
	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	d := &LazyPages{
		LogPath:    filepath.Join(workDir, logFile),
		SocketPath: filepath.Join(workDir, LazyPagesSocket),
		done:       make(chan struct{}),
	}
	// Both ends close-on-exec; the child gets the write end as fd 3 only.
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("criu lazy-pages: pipe: %w", err)
	}
	defer statusR.Close()
	extra := []*os.File{statusW}
	if opts.ImagesDirFile != nil {
		// The child's fd 4; CRIU opens the magic link once, at start.
		extra = append(extra, opts.ImagesDirFile)
		imagesDir = "/proc/self/fd/4"
	}
	err = d.start(criuPath, exec.Command(criuPath, "lazy-pages",
		"--images-dir", imagesDir,
		"--work-dir", workDir,
		"--log-file", logFile,
		"-v"+strconv.Itoa(logLevel),
		"--status-fd", "3"), workDir, extra)
	statusW.Close()
	if err != nil {
		return nil, err
	}
	if err := d.awaitReady(ctx, statusR, timeout); err != nil {
		return nil, err
	}
	return d, nil
}

// lazyPagesPaths checks opts' directories and log file name and makes the
// directories absolute (the daemon runs in the work directory).
func lazyPagesPaths(opts LazyPagesOptions) (imagesDir, workDir, logFile string, err error) {
	if opts.ImagesDir == "" {
		return "", "", "", errors.New("criu lazy-pages: no images directory")
	}
	workDir = cmp.Or(opts.WorkDir, opts.ImagesDir)
	logFile = cmp.Or(opts.LogFile, DefaultLazyPagesLog)
	if filepath.Base(logFile) != logFile {
		return "", "", "", fmt.Errorf("criu lazy-pages: log file %q must be a plain name (it goes into the work directory)", logFile)
	}
	if imagesDir, err = filepath.Abs(opts.ImagesDir); err != nil {
		return "", "", "", fmt.Errorf("criu lazy-pages: %w", err)
	}
	if workDir, err = filepath.Abs(workDir); err != nil {
		return "", "", "", fmt.Errorf("criu lazy-pages: %w", err)
	}
	for _, d := range []string{imagesDir, workDir} {
		if fi, err := os.Stat(d); err != nil {
			return "", "", "", fmt.Errorf("criu lazy-pages: %w", err)
		} else if !fi.IsDir() {
			return "", "", "", fmt.Errorf("criu lazy-pages: %s is not a directory", d)
		}
	}
	return imagesDir, workDir, logFile, nil
}

// start starts the daemon cmd detached in workDir, with extra as its fds 3
// on, its output in a memory file, and reaps it when it exits.
func (d *LazyPages) start(criuPath string, cmd *exec.Cmd, workDir string, extra []*os.File) error {
	out, err := memfd("criu-lazy-pages-output")
	if err != nil {
		return err
	}
	d.cmd, d.out = cmd, out
	cmd.Dir = workDir
	cmd.ExtraFiles = extra
	// stdin is /dev/null (nil). Not a pipe for the output: it would
	// SIGPIPE the daemon once we are gone.
	cmd.Stdout, cmd.Stderr = out, out
	// Own session: no terminal signals, and nothing that hits our process
	// group reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("criu: start %s lazy-pages: %w", criuPath, err)
	}
	d.PID = cmd.Process.Pid
	go func() {
		werr := cmd.Wait()
		if _, err := out.Seek(0, io.SeekStart); err == nil {
			b, _ := io.ReadAll(io.LimitReader(out, 64<<10))
			d.output = strings.TrimSpace(string(b))
		}
		out.Close()
		if werr != nil {
			d.err = d.failure("exited", werr)
		}
		close(d.done)
	}()
	return nil
}

// awaitReady waits for the daemon's readiness on status: CRIU writes one
// NUL byte once the socket listens, and closes the fd. A daemon that is not
// ready in time is killed.
func (d *LazyPages) awaitReady(ctx context.Context, status *os.File, timeout time.Duration) error {
	ready := make(chan error, 1)
	go func() {
		var b [1]byte
		n, err := status.Read(b[:])
		if n == 1 && b[0] == 0 {
			ready <- nil
			return
		}
		if err == nil || err == io.EOF {
			err = errors.New("no readiness signal")
		}
		ready <- err
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var err error
	var pipeErr bool
	select {
	case err = <-ready:
		pipeErr = err != nil
	case <-timer.C:
		err = fmt.Errorf("its socket %s was not ready after %s", d.SocketPath, timeout)
	case <-ctx.Done():
		err = fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if err == nil {
		if fi, serr := os.Stat(d.SocketPath); serr != nil || fi.Mode().Type() != os.ModeSocket {
			err = fmt.Errorf("it reported ready but %s is not a socket", d.SocketPath)
		}
	}
	if err == nil {
		return nil
	}
	// The status pipe closes when the daemon exits: its exit status and
	// log explain more than the pipe.
	if pipeErr {
		select {
		case <-d.done:
			if d.err != nil {
				return d.err
			}
			return d.failure("exited", err)
		case <-time.After(time.Second):
		}
	}
	d.Kill()
	<-d.done
	return d.failure("failed", err)
}

// failure builds the daemon's *Error from its log and output (once it has
// exited): one line, with the log path.
func (d *LazyPages) failure(what string, err error) *Error {
	e := newError("lazy-pages", d.LogPath, d.output, fmt.Errorf("daemon %d %s: %w", d.PID, what, err))
	if e.First != "" {
		e.First = fmt.Sprintf("daemon %d %s: %s", d.PID, what, e.First)
	}
	if e.Log == "" {
		e.Log = d.LogPath + " (not written)"
	}
	return e
}

// Done is closed when the daemon has exited (and been reaped).
func (d *LazyPages) Done() <-chan struct{} { return d.done }

// Wait waits until the daemon exits (normally, once every page has been
// copied into the restored tree) or ctx is done. It returns nil if the
// daemon exited with status 0, an *Error with the first error of its log
// otherwise, or ctx's error. It does not kill the daemon.
func (d *LazyPages) Wait(ctx context.Context) error {
	select {
	case <-d.done:
		return d.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill kills the daemon (SIGKILL) if it still runs, without waiting. Pages
// it has not copied yet are lost: the restored tree reads zeros there (and
// most likely crashes). Use it only when the restore failed.
func (d *LazyPages) Kill() {
	select {
	case <-d.done:
	default:
		_ = d.cmd.Process.Kill()
	}
}

// LazyPagesStats is what the lazy-pages daemon's log says it copied.
type LazyPagesStats struct {
	Tasks  int    // restored processes whose memory it served
	Copied uint64 // pages copied into them (on demand and in the background)
	Total  uint64 // lazy pages of their images
}

// "uffd: 1234-12: UFFD transferred pages: (65892/65892)" (debug level).
var lazyXferRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`uffd: -?\d+-\d+: UFFD transferred pages: \((\d+)/(\d+)\)`)
})

// ReadLazyPagesStats reads the summary the daemon writes to its log (at
// log level 4, as Restore runs it) as each task's memory is complete. It
// says nothing about a daemon still running. A task that unmapped memory
// or exited early has fewer pages copied than its total.
func ReadLazyPagesStats(logPath string) (*LazyPagesStats, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, fmt.Errorf("criu: lazy-pages log: %w", err)
	}
	defer f.Close()
	st := &LazyPagesStats{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := lazyXferRE().FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		c, _ := strconv.ParseUint(m[1], 10, 64)
		t, _ := strconv.ParseUint(m[2], 10, 64)
		st.Tasks++
		st.Copied += c
		st.Total += t
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("criu: lazy-pages log: %w", err)
	}
	return st, nil
}

// abort is called when the restore that d serves failed: it kills d (which
// otherwise waits forever for a restore that never connects) and returns
// restoreErr, extended with the daemon's own error if it had died first.
// A nil d returns restoreErr.
func (d *LazyPages) abort(restoreErr error) error {
	if d == nil {
		return restoreErr
	}
	// A daemon that failed first (and made the restore fail) is gone by
	// now or very soon; one still waiting for a restore is killed.
	var died bool
	select {
	case <-d.done:
		died = true
	case <-time.After(250 * time.Millisecond):
		d.Kill()
	}
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
	}
	if !died || d.err == nil || errors.Is(d.err, CauseRestoreGone) {
		return restoreErr
	}
	// One line: "criu restore failed: <restore's error>; lazy-pages daemon
	// <pid> exited: <its error> (log: <its log>) (log: <restore log>)".
	daemon := d.err.Error()
	var de *Error
	if errors.As(d.err, &de) && de.First != "" {
		daemon = de.First + " (log: " + de.Log + ")"
	}
	var e *Error
	if !errors.As(restoreErr, &e) {
		return fmt.Errorf("%w; lazy-pages %s", restoreErr, daemon)
	}
	ce := *e
	ce.Err = d.err
	if e.Err != nil {
		ce.Err = joinErrors([]error{e.Err, d.err})
	}
	switch {
	case ce.First != "":
		ce.First += "; lazy-pages " + daemon
	case e.Err != nil:
		ce.First = e.Err.Error() + "; lazy-pages " + daemon
	default:
		ce.First = "lazy-pages " + daemon
	}
	return &ce
}
