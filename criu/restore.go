package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	ImagesDir string // images written by Dump; only read
	// ImagesDirFile, if set, is ImagesDir already open: CRIU reads the
	// images through this descriptor rather than opening the path again,
	// so what was verified through it is what is restored.
	ImagesDirFile *os.File
	// WorkDir receives the log and stats-restore (CRIU writes both to its
	// work directory). Give each restore its own WorkDir, so that several
	// restores of one image can run at once; if empty, ImagesDir is used.
	WorkDir string
	LogFile string // log file name inside WorkDir; default "restore.log"
	// LogLevel is CRIU's log level, 1 (errors) to 4 (debug); default 2,
	// as for dumps.
	LogLevel int

	// TCPClose, TCPEstablished, ShellJob and FileLocks must match the
	// options the image was dumped with.
	TCPClose       bool
	TCPEstablished bool
	ShellJob       bool
	FileLocks      bool
	// LazyPages restores memory lazily through userfaultfd: Restore starts
	// a "criu lazy-pages" daemon for the images (see StartLazyPages),
	// restores without copying private anonymous memory, and leaves the
	// daemon serving page faults and copying the rest in the background;
	// it exits by itself when all pages are in (RestoreResult.Lazy). Works
	// on images of any Dump. Give the restore a WorkDir of its own.
	LazyPages bool

	// Notify, if set, is called at each CRIU stage (see NotifyFunc).
	Notify NotifyFunc

	// Inherit gives the restored tree the caller's descriptors in place of
	// files it had (see InheritFD, StdioPipes).
	Inherit []InheritFD

	// Session, if set, is a CRIU started ahead (StartRestore) for this
	// restore; Restore uses it if its ShellJob matches, closes it
	// otherwise, and in every case owns it.
	Session *RestoreSession
}

// RestoreSession is a "criu swrk" started before its restore request is
// known, so that CRIU's start (its wrapper, loader and libraries) overlaps
// the caller's own preparation, such as verifying the image.
type RestoreSession struct {
	s        *swrk
	shellJob bool
	inherit  []*os.File
}

// StartRestore starts CRIU for one later Restore (RestoreOptions.Session)
// of a shell job or not (see RestoreOptions.ShellJob), given the files
// that restore's Inherit will name (CRIU gets them at its start). A session that is
// never used must be closed. If the caller dies first, CRIU reads
// end-of-file instead of a request and exits having done nothing.
func StartRestore(ctx context.Context, criuPath string, shellJob bool, inherit ...*os.File) (*RestoreSession, error) {
	s, err := startSwrk(ctx, criuPath, !shellJob, false, inherit...)
	if err != nil {
		return nil, err
	}
	return &RestoreSession{s: s, shellJob: shellJob, inherit: inherit}, nil
}

// Close stops a session that was not used. It is safe on nil, after
// Restore took the session, and more than once.
func (rs *RestoreSession) Close() {
	if rs == nil || rs.s == nil {
		return
	}
	// Nothing was asked: CRIU has touched nothing and can be killed.
	_ = rs.s.cmd.Process.Kill()
	rs.s.close()
	rs.s = nil
}

// take returns the session's CRIU for a restore of a shell job or not
// that inherits files, or nil (having closed the session) if it was started
// for another kind or with other files.
func (rs *RestoreSession) take(shellJob bool, files []*os.File) *swrk {
	if rs == nil || rs.s == nil {
		return nil
	}
	if rs.shellJob != shellJob || !slices.Equal(rs.inherit, files) {
		rs.Close()
		return nil
	}
	s := rs.s
	rs.s = nil
	return s
}

// RestoreResult describes a successful restore.
type RestoreResult struct {
	PID      int           // PID of the restored root process
	Duration time.Duration // wall time to CRIU's answer, starting criu included
	LogPath  string
	// Stats is CRIU's stats-restore; nil (with StatsErr set) if unreadable.
	Stats    *RestoreStats
	StatsErr error
	// Lazy is the lazy-pages daemon still serving the tree's memory (nil
	// unless RestoreOptions.LazyPages). Its log is Lazy.LogPath. Do not
	// kill it, nor touch the images, before Lazy.Done().
	Lazy *LazyPages
	// Stages are CRIU's notifications in the order they came, each with
	// the time since Restore started.
	Stages []Stage

	exited chan struct{} // closed once CRIU's process is gone
}

// Wait returns once CRIU's process has exited. Restore returns as soon as
// CRIU answered, when the tree already runs; CRIU's exit (its cleanup,
// freeing its memory) overlaps the caller's next steps.
func (r *RestoreResult) Wait() {
	if r != nil && r.exited != nil {
		<-r.exited
	}
}

// Stage is one of CRIU's notifications during a restore and when it came,
// counted from the start of Restore.
type Stage struct {
	Script string
	At     time.Duration
}

// Restore restores the tree dumped in opts.ImagesDir with "criu swrk" and
// returns the PID of its root. The restored tree is detached from the
// caller: CRIU restores it as a child of the criu process (not with
// rst_sibling), which exits once the restore is done, so the tree is
// re-parented to the nearest child subreaper or PID 1. The caller need not
// (and cannot) wait for it, and may exit while it keeps running. CRIU puts
// the restored tree into a new time namespace. Every PID and thread ID of the
// image must be free (see CheckImagePIDsFree).
//
// Cancelling ctx stops the restore at CRIU's next notification (before
// forking, or once every task has its memory back): CRIU aborts and kills
// the half-restored tree, and Restore returns once CRIU exited. A restore
// past its last notification completes.
//
// If the caller dies during the restore, CRIU is not killed with it: it goes
// on to its next notification (before forking, or after every task restored
// its memory), finds nobody to answer, aborts and kills the tasks it forked,
// so no half-built tree is left. A caller dying after the "post-restore"
// notification leaves a completely restored tree: CRIU does not abort past
// that point.
func Restore(ctx context.Context, criuPath string, opts RestoreOptions) (*RestoreResult, error) {
	defer opts.Session.Close() // a no-op once taken below
	if opts.ImagesDir == "" {
		return nil, errors.New("criu restore: no images directory")
	}
	workDir := opts.WorkDir
	if workDir == "" {
		workDir = opts.ImagesDir
	}
	logFile := opts.LogFile
	if logFile == "" {
		logFile = "restore.log"
	}
	if filepath.Base(logFile) != logFile {
		return nil, fmt.Errorf("criu restore: log file %q must be a plain name (it goes into the work directory)", logFile)
	}
	imgDir := opts.ImagesDirFile
	if imgDir == nil {
		d, err := os.Open(opts.ImagesDir)
		if err != nil {
			return nil, fmt.Errorf("criu restore: images directory: %w", err)
		}
		defer d.Close()
		imgDir = d
	}
	wDir, err := os.Open(workDir)
	if err != nil {
		return nil, fmt.Errorf("criu restore: work directory: %w", err)
	}
	defer wDir.Close()
	logPath := filepath.Join(workDir, logFile)

	start := time.Now()
	var notifiedPID int
	var stages []Stage
	notify := func(script string, pid int) error {
		stages = append(stages, Stage{Script: script, At: time.Since(start)})
		if script == "post-restore" && pid > 0 {
			notifiedPID = pid
		}
		if opts.Notify != nil {
			return opts.Notify(script, pid)
		}
		return nil
	}

	s, lazy, err := restoreSwrk(ctx, criuPath, opts, workDir)
	if err != nil {
		return nil, err
	}
	s.tree.Store(true)
	resp, callErr := s.call(restoreRequest(opts, imgDir, wDir, logFile, s.inherit), notify)
	elapsed := time.Since(start)
	exited := make(chan struct{})
	if resp.GetSuccess() && callErr == nil {
		// The tree runs: CRIU's exit need not delay the caller.
		go func() {
			s.close()
			close(exited)
		}()
	} else {
		output, waitErr := s.close()
		close(exited)
		if err := respError(ctx, "restore", resp, callErr, output, waitErr, logPath); err != nil {
			return nil, lazy.abort(err)
		}
	}
	pid := int(resp.GetRestore().GetPid())
	if pid <= 0 {
		pid = notifiedPID
	}
	if pid <= 0 {
		<-exited
		return nil, lazy.abort(&Error{Op: "restore", Log: logPath, Err: errors.New("CRIU reported success but no PID")})
	}
	res := &RestoreResult{PID: pid, Duration: elapsed, LogPath: logPath, Lazy: lazy, Stages: stages, exited: exited}
	res.Stats, res.StatsErr = ReadRestoreStats(workDir)
	return res, nil
}

// restoreSwrk returns the CRIU that restores: the one opts.Session started
// ahead, or a new one; and the lazy-pages daemon, with opts.LazyPages.
func restoreSwrk(ctx context.Context, criuPath string, opts RestoreOptions, workDir string) (*swrk, *LazyPages, error) {
	files := inheritFiles(opts.Inherit)
	s := opts.Session.take(opts.ShellJob, files)
	var lazy *LazyPages
	if opts.LazyPages {
		var err error
		lazy, err = StartLazyPages(ctx, criuPath, LazyPagesOptions{ImagesDir: opts.ImagesDir, ImagesDirFile: opts.ImagesDirFile, WorkDir: workDir})
		if err != nil {
			if s != nil {
				(&RestoreSession{s: s}).Close()
			}
			return nil, nil, err
		}
	}
	if s != nil {
		s.watch(ctx) // this restore's deadline, not the session's
		return s, lazy, nil
	}
	s, err := startSwrk(ctx, criuPath, !opts.ShellJob, false, files...)
	if err != nil {
		return nil, nil, lazy.abort(err)
	}
	return s, lazy, nil
}

// restoreRequest is CRIU's restore request for opts, with the images and
// work directories passed as descriptors (CRIU reads what kcr opened and
// checked, not a path that may have changed since).
func restoreRequest(opts RestoreOptions, imgDir, wDir *os.File, logFile string, files []*os.File) *rpc.CriuReq {
	req := &rpc.CriuReq{
		Type: rpc.CriuReqType_RESTORE.Enum(),
		Opts: &rpc.CriuOpts{
			ImagesDirFd:    proto.Int32(int32(imgDir.Fd())),
			WorkDirFd:      proto.Int32(int32(wDir.Fd())),
			LeaveRunning:   proto.Bool(false),
			ShellJob:       proto.Bool(opts.ShellJob),
			FileLocks:      proto.Bool(opts.FileLocks),
			TcpClose:       proto.Bool(opts.TCPClose),
			TcpEstablished: proto.Bool(opts.TCPEstablished),
			LazyPages:      proto.Bool(opts.LazyPages),
			LogLevel:       proto.Int32(level(opts.LogLevel)),
			LogFile:        proto.String(logFile),
			// Always: if kcr dies, CRIU's next notification fails and
			// CRIU kills what it restored so far (see startSwrk).
			NotifyScripts: proto.Bool(true),
			// Not RstSibling: that would make the tree our child.
		},
	}
	if inChildUserNS() {
		req.Opts.Unprivileged = proto.Bool(true)
	}
	for _, in := range opts.Inherit {
		// CRIU's own descriptor for the file: 4 onwards, in order.
		fd := 4 + slices.Index(files, in.File)
		req.Opts.InheritFd = append(req.Opts.InheritFd, &rpc.InheritFd{Key: proto.String(in.Key), Fd: proto.Int32(int32(fd))})
	}
	return req
}

// inheritFiles lists the files of inherit once each, in order: CRIU gets
// them as fds 4, 5, ….
func inheritFiles(inherit []InheritFD) []*os.File {
	var files []*os.File
	for _, in := range inherit {
		if !slices.Contains(files, in.File) {
			files = append(files, in.File)
		}
	}
	return files
}
