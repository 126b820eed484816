package engine

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	Image string
	CRIU  string // explicit CRIU path (--criu)
	// HookWait is how long to wait for the app's after-restore hooks
	// before reporting them as pending (default 30 s).
	HookWait time.Duration
	// PIDWait is how long a PID held by a zombie may take to be reaped, or
	// one held by a restore that CRIU is aborting (its kcr died) to be freed.
	PIDWait time.Duration
	// CRIUWait, if positive, is the deadline of each CRIU restore: one that
	// has not answered by then (stuck in its restorer, on a hung volume) is
	// cancelled, and killed with the tasks it forked criu.KillGrace later
	// if it does not abort. Zero: ctx's deadline alone.
	CRIUWait time.Duration
	// WorkDir receives CRIU's restore log (default: a new directory under
	// $TMPDIR/kcr-restore-*).
	WorkDir string
	Logger  *slog.Logger
	// CRIULogLevel is CRIU's log level (default 2; 4 for debugging).
	CRIULogLevel int
	// Rehash verifies every file's checksum, also those unchanged on disk
	// since they were last verified.
	Rehash bool
	// AllowUntrusted restores, as root, an image that another user owns or
	// could have written (see images.OpenOptions.Trusted). VerifyKeys does
	// not replace it: a valid signature says who wrote the image, but a
	// user who can write the directory can still change it after the
	// check, while CRIU reads it.
	AllowUntrusted bool
	// VerifyKeys, if not empty, requires the manifest to be signed by one
	// of these keys (images.OpenOptions.VerifyKeys).
	VerifyKeys []ed25519.PublicKey
	// AfterVerify, if set, runs once the image is verified, before CRIU
	// reads it (tests swap the image directory there).
	AfterVerify func()
	// Lazy restores memory on demand through CRIU's lazy-pages daemon
	// (userfaultfd), so that restore time does not grow with RSS.
	Lazy bool
	// Count restores that many clones at once (0 or 1: one). Only images
	// of processes started with "kcr run" (init of their own PID namespace)
	// can be restored more than once at a time.
	Count int
	// AllowDuplicates restores an image that carries records (see
	// images.Manifest.CarriedRecords) although each would be sent again:
	// by every clone with Count > 1, and by the still running original of
	// a --leave-running image. Without it such restores fail with
	// ErrDuplicates.
	AllowDuplicates bool
	// Name labels the clones: NAME, or NAME-1 … NAME-N with Count > 1. The
	// app sees it in notify.Event.Name.
	Name string
	// Stdout and Stderr, if set, replace the pipes that the image's process
	// had as its stdout and stderr when it was dumped (its log, read by kcr
	// standby): CRIU could not reconnect those, whose reader is outside the
	// tree, and would give it new pipes nobody reads. A descriptor that was
	// not a pipe is restored as it was.
	Stdout, Stderr *os.File
}

// stdioFiles are the files o gives the restored tree (CRIU gets them at
// its start).
func (o RestoreOptions) stdioFiles() []*os.File {
	var files []*os.File
	for _, f := range []*os.File{o.Stdout, o.Stderr} {
		if f != nil {
			files = append(files, f)
		}
	}
	return files
}

// stdioInherit maps the pipes the image's root task had as stdout and
// stderr to o.Stdout and o.Stderr (criu.StdioPipes).
func (o RestoreOptions) stdioInherit(criuDir string) ([]criu.InheritFD, error) {
	if o.Stdout == nil && o.Stderr == nil {
		return nil, nil
	}
	pipes, err := criu.StdioPipes(criuDir)
	if err != nil {
		return nil, fmt.Errorf("read the image's stdout and stderr: %w", err)
	}
	var inherit []criu.InheritFD
	for fd, f := range []*os.File{1: o.Stdout, 2: o.Stderr} {
		key, ok := pipes[fd]
		if f == nil || !ok || (fd == 2 && pipes[1] == key && o.Stdout != nil) {
			continue // one pipe for both: it becomes Stdout
		}
		inherit = append(inherit, criu.InheritFD{Key: key, File: f})
	}
	return inherit, nil
}

// RestoreResult describes a restored process.
type RestoreResult struct {
	PID        int
	Name       string
	Generation uint64
	InstanceID string
	Timings    Timings
	LogPath    string
	Reports    []proto.HookReport
	// HooksPending is set when the app had not finished its after-restore
	// hooks within HookWait; it goes on with them by itself.
	HooksPending bool
	// HookErr is set when after-restore hooks failed. The process runs.
	HookErr error
	// CRIUStats is CRIU's own account of the restore (stats-restore), nil
	// if it could not be read.
	CRIUStats *criu.RestoreStats
	// LazyPID and LazyLog name the lazy-pages daemon of a lazy restore. It
	// serves the pages not restored yet and exits when all are copied; it
	// must not be killed before, nor the image removed.
	LazyPID int
	LazyLog string
}

// ErrNotClonable is returned for Count > 1 on an image whose process was
// not init of its own PID namespace.
var ErrNotClonable = errors.New("image cannot be restored more than once at a time")

// ErrDuplicates is returned for a restore that would send an image's carried
// records more than once, or process more than once the records it had in
// the application's hands; RestoreOptions.AllowDuplicates allows it.
var ErrDuplicates = errors.New("restore would send carried records again")

// CheckDuplicates refuses a restore of count copies of m that would send its
// carried records twice or more, or have the records that were in the
// application's hands (handed out by a consumer, not committed) processed
// twice or more, unless allowed.
func CheckDuplicates(image string, m *images.Manifest, count int, allow bool) error {
	carried, inApp := m.CarriedRecords(), m.InAppRecords()
	if allow || (carried <= 0 && inApp <= 0) || (count <= 1 && !m.Options.LeaveRunning) {
		return nil
	}
	var whats []string
	if carried > 0 {
		whats = append(whats, fmt.Sprintf("carries %d records (%s)", carried, strings.Join(m.Carriers(), ", ")))
	}
	if inApp > 0 {
		whats = append(whats, fmt.Sprintf("had up to %d records handed to the application and not committed (%s), which every copy processes", inApp, strings.Join(m.Holders(), ", ")))
	}
	what := image + " " + strings.Join(whats, " and ")
	copies := count
	if m.Options.LeaveRunning {
		copies++
	}
	why := fmt.Sprintf("--count %d would send each one %d times", count, copies)
	if carried <= 0 {
		why = fmt.Sprintf("--count %d would process each one %d times", count, copies)
	}
	if m.Options.LeaveRunning {
		why = fmt.Sprintf("it was taken with --leave-running, so the running original has them too: %d copies of each", copies)
		if count > 1 {
			why = fmt.Sprintf("it was taken with --leave-running and --count %d adds clones: %d copies of each", count, copies)
		}
	}
	return fmt.Errorf("%w: %s; %s; pass --allow-duplicates to restore anyway", ErrDuplicates, what, why)
}

// Restore verifies an image, restores it with CRIU, and tells the restored
// process that it is a new instance. It is RestoreClones with one clone.
func Restore(ctx context.Context, o RestoreOptions) (*RestoreResult, error) {
	o.Count = 1
	res, err := RestoreClones(ctx, o)
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// RestoreClones restores o.Count clones of an image concurrently. Each gets
// its own restore generation and instance id, so its own Kafka client ids.
// On error, the clones restored so far keep running and are returned with
// the error.
func RestoreClones(ctx context.Context, o RestoreOptions) ([]*RestoreResult, error) {
	return realDeps.restoreClones(ctx, o)
}

func (s deps) restoreClones(ctx context.Context, o RestoreOptions) ([]*RestoreResult, error) {
	pr, err := s.prepareRestore(ctx, o)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	return pr.restore(ctx)
}

// PreparedRestore is a restore done up to CRIU's request: the image
// verified and open, CRIU found, checked and started. A long-lived caller
// (kcr standby) prepares while it waits, so that a wake pays only for the
// restore itself. Restore it once, or Close it.
type PreparedRestore struct {
	s     deps
	o     RestoreOptions
	start time.Time
	img   *images.Image
	pre   Timings
	criu  string
	early *criu.RestoreSession
}

// PrepareRestore does every step of RestoreClones that does not depend on
// the moment of the restore: it verifies and opens the image and starts
// CRIU. The PIDs the image needs are checked by Restore.
func PrepareRestore(ctx context.Context, o RestoreOptions) (*PreparedRestore, error) {
	return realDeps.prepareRestore(ctx, o)
}

// Restore restores the prepared image (RestoreClones); its Timings count
// from the call, without the preparation's phases.
func (pr *PreparedRestore) Restore(ctx context.Context) ([]*RestoreResult, error) {
	pr.start = time.Now()
	pr.pre = nil
	defer pr.Close()
	if err := pr.img.Unchanged(); err != nil {
		// Changed while it waited (a disk, an operator): what is
		// restored must be what is verified, so verify it again.
		logger(pr.o.Logger).Warn("the prepared image changed; verifying it again", "err", err)
		if err := pr.reopen(ctx); err != nil {
			return nil, err
		}
	}
	return pr.restore(ctx)
}

// reopen verifies and opens the image again, and checks it as
// prepareRestore did.
func (pr *PreparedRestore) reopen(ctx context.Context) error {
	pr.img.Close()
	pr.img = nil
	t := time.Now()
	img, err := images.OpenWith(ctx, pr.o.Image, OpenOptions(pr.o.Rehash, pr.o.AllowUntrusted, pr.o.VerifyKeys))
	if err != nil {
		return err
	}
	pr.img = img
	pr.pre.Add(PhaseVerify, time.Since(t))
	if err := pr.s.checkImage(pr.o, img.Manifest); err != nil {
		return err
	}
	return checkCaps(pr.o.Image, img.CRIUDir())
}

// Close releases the image and the CRIU started ahead; a no-op after
// Restore, and on nil.
func (pr *PreparedRestore) Close() {
	if pr == nil {
		return
	}
	pr.early.Close()
	pr.early = nil
	if pr.img != nil {
		pr.img.Close()
		pr.img = nil
	}
}

func (s deps) prepareRestore(ctx context.Context, o RestoreOptions) (*PreparedRestore, error) {
	pr := &PreparedRestore{s: s, o: o, start: time.Now()}
	if pr.o.HookWait <= 0 {
		pr.o.HookWait = 30 * time.Second
	}
	if pr.o.PIDWait <= 0 {
		pr.o.PIDWait = 5 * time.Second
	}
	if pr.o.Count <= 0 {
		pr.o.Count = 1
	}
	o = pr.o
	// CRIU's version check, and then CRIU's own start for the first
	// restore, run while the image is verified.
	type found struct {
		path  string
		early *criu.RestoreSession
		err   error
	}
	criuCh := make(chan found, 1)
	go func() {
		p, err := s.findCRIU(ctx, o.CRIU)
		var early *criu.RestoreSession
		if err == nil {
			early, _ = s.restorer.Start(ctx, p, o.stdioFiles()...) // on failure, restoreOne starts CRIU as usual
		}
		criuCh <- found{p, early, err}
	}()
	// drop waits for the CRIU search and closes what it started, on the
	// paths that end before any restore.
	drop := func() {
		if fc := <-criuCh; fc.early != nil {
			fc.early.Close()
		}
	}
	t := time.Now()
	img, err := images.OpenWith(ctx, o.Image, OpenOptions(o.Rehash, o.AllowUntrusted, o.VerifyKeys))
	if err != nil {
		drop()
		return nil, err
	}
	pr.pre.Add(PhaseVerify, time.Since(t))
	if o.AfterVerify != nil {
		o.AfterVerify()
	}
	if err := s.checkImage(o, img.Manifest); err != nil {
		img.Close()
		drop()
		return nil, err
	}
	if err := checkCaps(o.Image, img.CRIUDir()); err != nil {
		img.Close()
		drop()
		return nil, err
	}
	t = time.Now()
	fc := <-criuCh
	if fc.err != nil {
		img.Close()
		return nil, fc.err
	}
	pr.pre.Add(PhaseCRIUVersion, time.Since(t))
	pr.img, pr.criu, pr.early = img, fc.path, fc.early
	return pr, nil
}

// checkImage refuses restores of the image that o asks for and that would
// duplicate its records or that it cannot do.
func (s deps) checkImage(o RestoreOptions, m *images.Manifest) error {
	if err := CheckDuplicates(o.Image, m, o.Count, o.AllowDuplicates); err != nil {
		return err
	}
	if err := checkKafkaTCPClose(o.Image, m, o.Count, o.AllowDuplicates); err != nil {
		return err
	}
	if m.Options.TCPClose && o.Count > 1 && len(m.Options.TCPClosedKafka) == 0 {
		logger(o.Logger).Warn("the image was dumped with --tcp-close: every clone starts with the state of the connections CRIU dropped (client ids, sessions, sequence numbers of any protocol)", "image", o.Image, "count", o.Count)
	}
	if o.Count > 1 && !m.Process.PIDNamespace {
		return fmt.Errorf("%s: %w: PID %d was not init of its own PID namespace; start the service with \"kcr run\" to clone it", o.Image, ErrNotClonable, m.Process.PID)
	}
	return nil
}

// restore runs the prepared restore: the PIDs checked, then each clone.
func (pr *PreparedRestore) restore(ctx context.Context) ([]*RestoreResult, error) {
	s, o, img := pr.s, pr.o, pr.img
	pre := append(Timings{}, pr.pre...)
	if !img.Manifest.Process.PIDNamespace {
		t := time.Now()
		if err := s.pidsFree(ctx, img, o.PIDWait); err != nil {
			return nil, err
		}
		if w := time.Since(t); w > 50*time.Millisecond {
			pre.Add(PhasePIDWait, w)
		}
	}
	// An interrupt while the image was verified starts no CRIU.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("restore %s: %w", o.Image, err)
	}
	early := pr.early
	pr.early = nil
	defer early.Close() // a no-op once a restore took it
	inherit, err := o.stdioInherit(img.CRIUDir())
	if err != nil {
		return nil, err
	}

	results := make([]*RestoreResult, o.Count)
	errs := make([]error, o.Count)
	done := make(chan struct{})
	for i := range o.Count {
		go func() {
			defer func() { done <- struct{}{} }()
			name := o.Name
			if o.Count > 1 {
				if name == "" {
					name = "clone"
				}
				name = fmt.Sprintf("%s-%d", name, i+1)
			}
			var sess *criu.RestoreSession
			if i == 0 {
				sess = early
			}
			results[i], errs[i] = s.restoreOne(ctx, o, img, pr.criu, name, sess, inherit)
		}()
	}
	for range o.Count {
		<-done
	}
	var ok []*RestoreResult
	var failed []error
	for i, r := range results {
		if errs[i] != nil {
			failed = append(failed, errs[i])
			continue
		}
		r.Timings = append(append(Timings{}, pre...), r.Timings...)
		r.Timings.Add(PhaseTotal, time.Since(pr.start))
		ok = append(ok, r)
	}
	if len(failed) > 0 {
		if o.Count == 1 {
			return nil, failed[0]
		}
		return ok, fmt.Errorf("%d of %d clones failed to restore: %w", len(failed), o.Count, failed[0])
	}
	return ok, nil
}

// restoreOne restores one copy of a verified image.
// A CRIU started ahead (sess, may be nil) is used or closed.
func (s deps) restoreOne(ctx context.Context, o RestoreOptions, img *images.Image, criuPath, name string, sess *criu.RestoreSession, inherit []criu.InheritFD) (res *RestoreResult, err error) {
	defer sess.Close() // a no-op once the restore took it
	m := img.Manifest
	res = &RestoreResult{Name: name}
	work := o.WorkDir
	if work == "" || o.Count > 1 {
		work, err = os.MkdirTemp(o.WorkDir, "kcr-restore-")
		if err != nil {
			return nil, fmt.Errorf("restore work directory: %w", err)
		}
		// Our own work directory goes once the restore succeeded; after a
		// failure it stays for its log. The lazy-pages daemon keeps using
		// its work directory after the restore.
		defer func() {
			if err == nil && !o.Lazy {
				os.RemoveAll(work)
				if res != nil {
					res.LogPath = ""
				}
			}
		}()
	}
	imgDir, err := img.CRIUDirFile()
	if err != nil {
		return nil, err
	}
	defer imgDir.Close()
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if o.CRIUWait > 0 {
		rctx, cancel = context.WithTimeout(ctx, o.CRIUWait)
	}
	defer cancel() // after CRIU's exit (rr.Wait, deferred below)
	generation, needGen := countRestore(rctx, img.Dir)
	t := time.Now()
	rr, canceled, err := s.criuRestore(rctx, o.Count, criuPath, criu.RestoreOptions{
		ImagesDir: img.CRIUDir(), ImagesDirFile: imgDir, WorkDir: work, LazyPages: o.Lazy, LogLevel: o.CRIULogLevel,
		TCPClose: m.Options.TCPClose, ShellJob: m.Options.ShellJob, FileLocks: m.Options.FileLocks,
		Session: sess, Notify: needGen, Inherit: inherit,
	})
	if canceled {
		return nil, err
	}
	res.Timings.Add(PhaseRestore, time.Since(t))
	c := generation()
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		return nil, stuckRestore(o, err)
	}
	if err != nil {
		if c.err != nil {
			return nil, fmt.Errorf("restore of %s aborted before it resumed: %w", o.Image, c.err)
		}
		return nil, err
	}
	// CRIU's exit overlaps the rest; the work directory goes after it.
	defer rr.Wait()
	res.Timings = append(res.Timings, criuStages(rr)...)
	if c.err != nil { // a CRIU that sent no post-restore (not the real one)
		return nil, c.err
	}
	res.Generation = c.gen
	res.Timings.Add(PhaseGeneration, c.d)
	for _, st := range rr.Stages {
		logger(o.Logger).Debug("CRIU notification", "script", st.Script, "at", st.At)
	}
	res.PID = rr.PID
	res.LogPath = rr.LogPath
	res.CRIUStats = rr.Stats
	if rr.Lazy != nil {
		res.LazyPID, res.LazyLog = rr.Lazy.PID, rr.Lazy.LogPath
	}

	if !m.NoHooks {
		s.runAfterHooks(ctx, res, rr.PID, m.Process.PID, c.gen, name, o.HookWait)
	}
	return res, nil
}

// runAfterHooks tells the restored tree (pid, dumped as oldPID) it was
// restored, as copy gen, and records the answer in res.
func (s deps) runAfterHooks(ctx context.Context, res *RestoreResult, pid, oldPID int, gen uint64, name string, wait time.Duration) {
	t := time.Now()
	done, err := s.afterRestore(ctx, pid, oldPID, gen, name, wait)
	res.Timings.Add(PhaseAfterHooks, time.Since(t))
	res.Reports = done.Reports
	res.InstanceID = done.InstanceID
	switch {
	case errors.Is(err, client.ErrPending):
		res.HooksPending = true
	case err != nil:
		res.HookErr = err
	}
}

// counted is a restore's count (its generation), how long taking it took,
// and why it could not be taken.
type counted struct {
	gen uint64
	d   time.Duration
	err error
}

// countRestore counts a restore of the image in dir, durably, while CRIU
// restores: the count is needed only to tell the app, and a failed restore
// uses one up anyway. generation waits for the count, or for ctx (a hung
// volume); needGen is CRIU's notification callback that fails post-restore
// without it, so that CRIU kills a tree that could not be told it is a new
// instance before it resumes.
func countRestore(ctx context.Context, dir string) (generation func() counted, needGen func(string, int) error) {
	genCh := make(chan counted, 1)
	go func() {
		t := time.Now()
		gen, err := nextGeneration(dir)
		genCh <- counted{gen, time.Since(t), err}
	}()
	generation = sync.OnceValue(func() counted {
		select {
		case c := <-genCh:
			return c
		case <-ctx.Done():
			return counted{err: fmt.Errorf("count the restore in %s: %w", dir, ctx.Err())}
		}
	})
	needGen = func(script string, _ int) error {
		if script == "post-restore" {
			return generation().err
		}
		return nil
	}
	return generation, needGen
}

// stuckRestore is the error of a restore whose CRIU did not answer within
// o.CRIUWait (err, its error): one line with what CRIU's log says went
// wrong, and the fix. It wraps err (a *criu.Error, ctx's deadline).
func stuckRestore(o RestoreOptions, err error) error {
	first, hint, log := "", "", ""
	var ce *criu.Error
	if errors.As(err, &ce) && ce.Log != "" {
		log = ce.Log
		first, hint = criu.ParseLogFile(log)
	}
	msg := fmt.Sprintf("restore of %s: CRIU did not finish within %s (--criu-wait) and was stopped, with the tasks it had restored so far", o.Image, o.CRIUWait)
	if first != "" {
		msg += "; CRIU's first error: " + first
	}
	if log != "" {
		msg += " (log: " + log + ")"
	}
	if hint == "" {
		hint = "see CRIU's log; a restore that only needs more time (a slow disk, a large image) takes a longer --criu-wait"
	}
	return &stuckError{msg: msg + "; hint: " + hint, err: err}
}

// stuckError is a restore stopped at its deadline (stuckRestore).
type stuckError struct {
	msg string
	err error
}

func (e *stuckError) Error() string { return e.msg }
func (e *stuckError) Unwrap() error { return e.err }

// criuRestore has CRIU restore one copy, and tries again (up to 10 times)
// when count clones race for a bound Unix socket path: CRIU unlinks and
// binds, and a sibling can bind in between. The clone then moves its
// control socket, so another try settles it. canceled reports that ctx
// ended while it waited to try again; err is the last attempt's.
func (s deps) criuRestore(ctx context.Context, count int, criuPath string, opts criu.RestoreOptions) (rr *criu.RestoreResult, canceled bool, err error) {
	for attempt := 1; ; attempt++ {
		rr, err = s.restorer.Restore(ctx, criuPath, opts)
		opts.Session = nil // used (or closed) by the first attempt
		if err == nil || count <= 1 || attempt == 10 || !bindRace(err) {
			return rr, false, err
		}
		select {
		case <-ctx.Done():
			return nil, true, err
		case <-time.After(time.Duration(5+rand.IntN(40)) * time.Millisecond):
		}
	}
}

// criuStages splits CRIU's part of a restore at its notifications: its
// start (kernel probing, reading the images) until the first, the restore
// of the tasks until the last, then its answer.
func criuStages(rr *criu.RestoreResult) Timings {
	if len(rr.Stages) == 0 {
		return nil
	}
	first, last := rr.Stages[0].At, rr.Stages[len(rr.Stages)-1].At
	var t Timings
	t.Add(PhaseCRIUStart, first)
	t.Add(PhaseCRIUTasks, last-first)
	t.Add(PhaseCRIUAnswer, rr.Duration-last)
	return t
}

// bindRace reports a CRIU failure that a sibling clone restoring the same
// bound Unix socket path at the same moment explains: bind finds the path
// taken, or the file CRIU just bound is unlinked before it sets its owner.
func bindRace(err error) bool {
	return errors.Is(err, criu.CauseUnixBindInUse) || errors.Is(err, criu.CauseFileVanished)
}

// afterRestore sends the restored message. The socket was restored by CRIU,
// so it is found through the new PID like any other. A clone with a new
// host PID moves its socket to one named after that PID (the image's path
// is shared by every clone), so kcr waits for that one.
func (s deps) afterRestore(ctx context.Context, pid, origPID int, gen uint64, name string, wait time.Duration) (proto.Message, error) {
	own := proto.SocketName(pid)
	deadline := time.Now().Add(s.socketWait)
	for {
		sock, path, err := s.findApp(pid)
		if err == nil && (pid == origPID || filepath.Base(path) == own) {
			return sock.RestoredAs(ctx, gen, name, wait)
		}
		if time.Now().After(deadline) {
			if err != nil {
				return proto.Message{}, fmt.Errorf("restored process %d: %w", pid, err)
			}
			// The app did not move its socket: it is not a clone, or it
			// already detected its restore by itself. Use what is there.
			return sock.RestoredAs(ctx, gen, name, wait)
		}
		select {
		case <-ctx.Done():
			return proto.Message{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// openOptions are the checks a restore makes of an image: as root, that no
// other user could have written it (unless allowUntrusted), and the
// signature if keys are given.
func OpenOptions(rehash, allowUntrusted bool, keys []ed25519.PublicKey) images.OpenOptions {
	return images.OpenOptions{Rehash: rehash, Trusted: os.Geteuid() == 0 && !allowUntrusted, VerifyKeys: keys}
}

// checkPIDsFree checks the PIDs the image needs (criu.CheckImagePIDsFree),
// reading its process tree through the directory that was verified.
func checkPIDsFree(ctx context.Context, img *images.Image, wait time.Duration) error {
	d, err := img.CRIUDirFile()
	if err != nil {
		return err
	}
	defer d.Close()
	return criu.CheckImagePIDsFree(ctx, fmt.Sprintf("/proc/self/fd/%d", d.Fd()), wait)
}
