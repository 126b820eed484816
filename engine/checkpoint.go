package engine

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// CheckpointOptions configures Checkpoint.
type CheckpointOptions struct {
	PID    int
	Output string // image directory to create; must not exist or be empty
	// LeaveRunning keeps the process running after the dump; it resumes
	// with Resume semantics.
	LeaveRunning bool
	// HookBudget bounds the before-checkpoint hooks (default 10 s).
	HookBudget time.Duration
	// ResumeAfter is how long the app waits for kcr after its hooks ran
	// before it resumes by itself (default HookBudget + 60 s).
	ResumeAfter time.Duration
	// TCPClose lets CRIU dump TCP connections that no hook closed; they are
	// closed in the restored process. kcr never suggests it for a Kafka
	// client's connections (see KafkaPorts), and records those it drops
	// in the manifest, so that restoring more than one copy is refused.
	TCPClose bool
	// KafkaPorts are the broker ports whose connections kcr takes for a
	// Kafka client's (default DefaultKafkaPorts).
	KafkaPorts []int
	// Abandonable lets a cancelled ctx end the dump within a chunk of
	// pages, the process resumed (criu.SessionOptions.Abandonable), not
	// only once CRIU wrote every page. Otherwise a cancel during the dump
	// waits for CRIU's post-dump stage.
	Abandonable bool
	// NoHooks dumps a process that has no kcr control socket.
	NoHooks bool
	// RequireDrained fails the checkpoint (a *proto.HookFailure whose CarryVeto is
	// true) when a resource would carry records into the image.
	RequireDrained bool
	// ShellJob forces CRIU's shell-job mode; it is detected otherwise.
	ShellJob bool
	CRIU     string // explicit CRIU path (--criu)
	// CRIULogLevel is CRIU's log level (default 2; 4 for debugging).
	CRIULogLevel int
	Logger       *slog.Logger
	// AfterHooks, if set, runs after the hooks succeeded and before CRIU is
	// asked to dump (tests use it to kill kcr at that point).
	AfterHooks func()
	// AtPostDump, if set, runs when CRIU reached its post-dump stage (the
	// images written, the tree still seized), before kcr lets it finish
	// (tests kill kcr there).
	AtPostDump func()
	// AfterDump, if set, runs after CRIU's dump and before the image is
	// published (tests kill kcr there; "kcr recover" finishes the image).
	AfterDump func()
	// SignKey, if set, signs the image's manifest (images.SignatureName).
	SignKey ed25519.PrivateKey
	// KeepFailedLog, if set, is where CRIU's log of a failed dump is moved
	// (replacing what is there) before the unfinished image is removed; the
	// error then names it. Default: beside the image, as
	// "<output>.failed-dump.log".
	KeepFailedLog string
}

// CheckpointResult describes a written image.
type CheckpointResult struct {
	Image    string
	Manifest *images.Manifest
	Timings  Timings
	// ResumeErr is set when the app was left running and its resume hooks
	// failed or are still pending; the image is complete all the same.
	ResumeErr error
	Warnings  []string
}

// Checkpoint runs the app's hooks, dumps it with CRIU and writes an image.
// Whatever fails, the app is resumed and no partial image is left behind.
func Checkpoint(ctx context.Context, o CheckpointOptions) (*CheckpointResult, error) {
	return realDeps.checkpoint(ctx, o)
}

// checkpoint is Checkpoint with the process, the app and CRIU behind d:
// prepare → quiesce → dump → publish.
func (d deps) checkpoint(ctx context.Context, o CheckpointOptions) (*CheckpointResult, error) {
	if o.HookBudget <= 0 {
		o.HookBudget = proto.DefaultHookBudget
	}
	if o.ResumeAfter <= 0 {
		o.ResumeAfter = proto.ResumeAfterFor(o.HookBudget)
	}
	r := &checkpointRun{deps: d, o: o, ctx: ctx, log: logger(o.Logger), start: time.Now(), res: &CheckpointResult{}}
	defer r.close()
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	if err := r.quiesce(ctx); err != nil {
		return nil, err
	}
	if err := r.dump(ctx); err != nil {
		return nil, err
	}
	return r.publish(ctx)
}

// checkpointRun is one checkpoint, step by step. Until the dump, every
// failure resumes the app (if its hooks ran) and kills CRIU, which has not
// touched it; close undoes what is left.
type checkpointRun struct {
	deps  deps
	o     CheckpointOptions
	ctx   context.Context // the checkpoint's (CRIU's notifications have none)
	log   *slog.Logger
	start time.Time
	res   *CheckpointResult

	proc  images.Process
	shell bool // CRIU's shell-job mode
	sess  dumper
	img   *images.Builder
	pd    pendingDump      // the dump request CRIU prepares for
	dr    *criu.DumpResult // set once CRIU dumped
	criuV criu.Version
	app   appControl // nil with NoHooks
	sock  string     // the app's control socket
	// hooksRan is set once the app's before-checkpoint hooks succeeded: from
	// then on, a failure must resume it.
	hooksRan bool
	reports  []proto.HookReport
	m        *images.Manifest
	// kj tells a Kafka client's connections; preProbs are what the first
	// preflight found, closedKafka the Kafka connections --tcp-close drops.
	kj          kafkaJudge
	preProbs    []criu.Problem
	closedKafka []string
}

// close undoes what the run started, in this order: wait for CRIU's exit,
// kill a dump CRIU was never let go on, remove an unfinished image (a no-op
// once committed), end the CRIU session.
func (r *checkpointRun) close() {
	if r.dr != nil {
		r.dr.Wait()
	}
	if r.pd != nil {
		r.pd.Cancel()
	}
	if r.img != nil {
		r.img.Abort()
	}
	if r.sess != nil {
		r.sess.Close()
	}
}

// prepare starts CRIU on the dump request at once, so that its start and
// its probing of the kernel (most of a plain "criu dump" where /run keeps no
// kerndat cache) overlap kcr's own preparation: the preflight, the socket
// search, CRIU's version. CRIU waits at its pre-dump stage, before it
// touches the app, until the dump step lets it go.
func (r *checkpointRun) prepare(ctx context.Context) error {
	if err := r.startCRIU(ctx); err != nil {
		return err
	}
	r.res.Timings.Add(PhasePrepare, time.Since(r.start))

	// Sockets CRIU can never dump (MPTCP) are found before any hook runs,
	// so that the app is not disturbed for nothing; without hooks, all
	// that CRIU would refuse is found here, once.
	var kafkaClients []string
	if r.deps.kafkaClients != nil {
		kafkaClients = r.deps.kafkaClients(r.o.PID)
	}
	r.kj = newKafkaJudge(r.o.KafkaPorts, kafkaClients)
	if probs, err := r.deps.preflight(r.o.PID); err == nil {
		r.preProbs = probs
		if err := fatalProblems(probs, r.o.TCPClose, !r.o.NoHooks, r.kj); err != nil {
			return err
		}
	} else {
		r.log.Debug("preflight", "err", err)
	}
	if err := r.findApp(); err != nil {
		return err
	}
	// CRIU answered its version meanwhile (the request went with its
	// start); a CRIU unfit for this kernel is refused before any hook.
	v, err := r.sess.Version()
	if err != nil {
		return err
	}
	r.criuV = v
	return nil
}

// startCRIU reads the process, starts CRIU, creates the image directory and
// hands CRIU the dump request.
func (r *checkpointRun) startCRIU(ctx context.Context) error {
	proc, err := r.deps.process(r.o.PID)
	if err != nil {
		return err
	}
	r.proc = proc
	r.shell = r.o.ShellJob
	if !r.shell {
		if need, err := r.deps.shellJobNeeded(r.o.PID); err == nil && need {
			r.shell = true
		}
	}
	if r.sess, err = r.deps.openDumper(ctx, r.o.CRIU, criu.SessionOptions{ShellJob: r.shell, Abandonable: r.o.Abandonable}); err != nil {
		return err
	}
	if r.img, err = CreateImage(r.o.Output, r.o.SignKey); err != nil {
		return err
	}
	r.res.Image = r.img.Final()
	pd, err := r.sess.Begin(criu.DumpOptions{
		PID: r.o.PID, ImagesDir: r.img.CRIUDir(), LeaveRunning: r.o.LeaveRunning,
		ShellJob: r.shell, FileLocks: true, TCPClose: r.o.TCPClose, LogLevel: r.o.CRIULogLevel,
		Notify: r.notify,
	})
	if err != nil {
		return err
	}
	r.pd = pd
	return nil
}

// notify is CRIU's notification handler: every stage goes on. At
// post-dump, an abandonable checkpoint seals the pages first (prehash).
func (r *checkpointRun) notify(script string, _ int) error {
	if script != "post-dump" {
		return nil
	}
	if r.o.AtPostDump != nil {
		r.o.AtPostDump()
	}
	if r.o.Abandonable {
		return r.prehash()
	}
	return nil
}

// prehash hashes and syncs the pages, the bulk of the image, while CRIU
// holds the dumped process frozen at its post-dump stage: until the pages
// are durable the checkpoint can still be abandoned (a cancel fails the
// stage, and CRIU resumes the process), so a wake never waits for the
// hashing and the sync. publish then has only the small files left.
func (r *checkpointRun) prehash() error {
	t := time.Now()
	ents, err := os.ReadDir(r.img.CRIUDir())
	if err != nil {
		return err
	}
	var rels []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "pages-") && strings.HasSuffix(e.Name(), ".img") {
			rels = append(rels, images.CRIUSubdir+"/"+e.Name())
		}
	}
	err = r.img.Prehash(r.ctx, rels)
	r.res.Timings.Add(PhasePrehash, time.Since(t))
	return err
}

// findApp finds the app's control socket; with NoHooks it only warns that
// one exists.
func (r *checkpointRun) findApp() error {
	if r.o.NoHooks {
		if _, p, err := r.deps.findApp(r.o.PID); err == nil {
			r.log.Warn("the process has a kcr control socket, but --no-hooks skips its hooks", "socket", p)
		}
		return nil
	}
	app, sock, err := r.deps.findApp(r.o.PID)
	if err != nil {
		return err
	}
	r.app, r.sock = app, sock
	return nil
}

// quiesce runs the app's before-checkpoint hooks once CRIU is ready to
// seize it, so that CRIU's preparation is not part of the time the app's
// resources stay quiesced, then checks what the hooks left open.
func (r *checkpointRun) quiesce(ctx context.Context) error {
	t := time.Now()
	if err := r.pd.Ready(ctx); err != nil {
		return err
	}
	r.res.Timings.Add(PhaseCRIUReady, time.Since(t))
	if err := r.runHooks(ctx); err != nil {
		return err
	}
	if r.o.AfterHooks != nil {
		r.o.AfterHooks()
	}
	if err := ctx.Err(); err != nil {
		r.abort("checkpoint cancelled")
		return err
	}
	return r.checkLeftOpen()
}

// checkLeftOpen judges what is left open after the hooks, which decides
// whether CRIU can succeed (without hooks the first look already judged
// everything), and notes the Kafka connections --tcp-close will drop.
func (r *checkpointRun) checkLeftOpen() error {
	if !r.o.NoHooks {
		if probs, err := r.deps.preflight(r.o.PID); err == nil {
			if err := fatalProblems(probs, r.o.TCPClose, false, r.kj); err != nil {
				r.abort("checkpoint aborted: " + err.Error())
				return err
			}
			if r.o.TCPClose {
				r.closedKafka = r.kj.closedByCRIU(probs)
			}
		}
	} else if r.o.TCPClose && r.preProbs != nil {
		r.closedKafka = r.kj.closedByCRIU(r.preProbs)
	}
	if len(r.closedKafka) > 0 {
		r.res.Warnings = append(r.res.Warnings, fmt.Sprintf("--tcp-close drops Kafka connections that no hook closed (%s): the image keeps the client's producer id, sequence numbers and group membership; restore one copy only (kcr refuses --count > 1 without --allow-duplicates), and wrap the client with kafkahooks or kgohooks", strings.Join(r.closedKafka, "; ")))
	}
	return nil
}

// runHooks asks the app to run its before-checkpoint hooks (none with
// NoHooks).
func (r *checkpointRun) runHooks(ctx context.Context) error {
	if r.app == nil {
		return nil
	}
	t := time.Now()
	hctx := ctx
	if r.o.Abandonable {
		// An abandoned checkpoint lets the hooks finish (HookBudget
		// bounds them), then resumes the app: hooks cut off midway would
		// leave it quiesced until its own ResumeAfter.
		hctx = context.WithoutCancel(ctx)
	}
	m, err := r.app.Checkpoint(hctx, client.CheckpointRequest{
		HookBudget: r.o.HookBudget, ResumeAfter: r.o.ResumeAfter, LeaveRunning: r.o.LeaveRunning, RequireDrained: r.o.RequireDrained})
	r.res.Timings.Add(PhaseHooks, time.Since(t))
	if _, ok := errors.AsType[*proto.HookFailure](err); ok {
		return err
	}
	if err != nil {
		return fmt.Errorf("before-checkpoint hooks: %w", err)
	}
	r.hooksRan = true
	r.reports = m.Reports
	// The peer check vouched for the listener; the app must agree on
	// which process it is.
	if m.PID != r.o.PID {
		r.abort("checkpoint aborted: the app answered for another PID")
		return fmt.Errorf("%w: %s of PID %d answered ready for PID %d: refusing to dump", client.ErrUnsafeSocket, r.sock, r.o.PID, m.PID)
	}
	return nil
}

// dump writes the draft manifest that lets "kcr recover" finish the image
// if kcr dies after the dump, lets CRIU dump, then resumes the app
// (LeaveRunning) or waits for the dumped process to be gone.
func (r *checkpointRun) dump(ctx context.Context) error {
	r.m = r.draftManifest()
	t := time.Now()
	if err := r.img.WritePending(r.m); err != nil {
		r.abort("checkpoint aborted: " + err.Error())
		return err
	}
	r.res.Timings.Add(PhaseDraft, time.Since(t))

	t = time.Now()
	unlock := func() {}
	if r.proc.PIDNamespace {
		unlock = lockDumpCwd(ctx, r.o.PID, r.log)
	}
	dr, err := r.pd.Go(ctx)
	unlock()
	r.res.Timings.Add(PhaseFreezeDump, time.Since(t))
	if err != nil {
		reason := "dump failed: " + err.Error()
		if ctx.Err() != nil {
			// Abandoned: CRIU resumed the process.
			reason = "checkpoint cancelled"
		}
		r.abort(reason)
		return r.keepFailedLog(err, ctx.Err() != nil)
	}
	r.dr = dr
	if r.o.AfterDump != nil {
		r.o.AfterDump()
	}

	t = time.Now()
	switch {
	case r.o.LeaveRunning:
		if r.hooksRan {
			r.res.ResumeErr = r.resume("leave-running")
		}
		r.res.Timings.Add(PhaseResume, time.Since(t))
	case !r.proc.PIDNamespace:
		// The process must really be gone before the image is declared done:
		// a restore on this host needs its PID. (Init of its own PID
		// namespace is restored into a new namespace and needs no PID.)
		// Dumped: an abandon that came too late does not cut this wait.
		if _, err := r.deps.waitGone(context.WithoutCancel(ctx), r.o.PID, 10*time.Second); err != nil {
			r.res.Warnings = append(r.res.Warnings, fmt.Sprintf("dumped process %d did not exit: %v", r.o.PID, err))
		}
		r.res.Timings.Add(PhaseExit, time.Since(t))
	}
	return nil
}

// keepFailedLog moves CRIU's log of a failed dump to KeepFailedLog, or
// beside the image unless the checkpoint was cancelled (an interrupted
// kcr leaves nothing behind), and names it in err: the unfinished image,
// where CRIU wrote it, is removed. A rename: it needs no space on a full
// disk.
func (r *checkpointRun) keepFailedLog(err error, cancelled bool) error {
	var ce *criu.Error
	if !errors.As(err, &ce) || ce.Log == "" {
		return err
	}
	kept := r.o.KeepFailedLog
	var rerr error
	switch {
	case kept != "":
		rerr = os.Rename(ce.Log, kept)
	case cancelled:
		ce.Log = ""
		return err
	default: // CRIU dumped into the image being built: r.img is set
		kept, rerr = r.img.KeepBeside(ce.Log, filepath.Base(r.img.Final())+failedDumpLogSuffix)
	}
	if rerr != nil {
		r.log.Warn("keeping CRIU's log of the failed dump", "err", rerr)
		ce.Log = ""
		return err
	}
	ce.Log = kept
	return err
}

// failedDumpLogSuffix names CRIU's log of a failed dump kept beside the
// image it was to write.
const failedDumpLogSuffix = ".failed-dump.log"

// draftManifest is the manifest of the image so far: everything but CRIU's
// statistics and the phases after the dump.
func (r *checkpointRun) draftManifest() *images.Manifest {
	m := &images.Manifest{
		KCRVersion:    Version,
		CRIUVersion:   r.criuV.String(),
		Kernel:        Kernel(),
		Host:          Hostname(),
		Process:       r.proc,
		ControlSocket: r.sock,
		NoHooks:       r.o.NoHooks,
		Options:       images.Options{LeaveRunning: r.o.LeaveRunning, TCPClose: r.o.TCPClose, ShellJob: r.shell, FileLocks: true, TCPClosedKafka: r.closedKafka},
	}
	AddResources(m, r.reports)
	return m
}

// publish completes the manifest and commits the image: hashed, synced and
// renamed into place, while CRIU exits.
func (r *checkpointRun) publish(ctx context.Context) (*CheckpointResult, error) {
	if s := r.dr.Stats; s != nil {
		r.m.CRIUStats = images.CRIUStats{
			FreezingTimeUS: s.FreezingTime.Microseconds(), FrozenTimeUS: s.FrozenTime.Microseconds(),
			MemdumpTimeUS: s.MemdumpTime.Microseconds(), MemwriteTimeUS: s.MemwriteTime.Microseconds(),
			PagesScanned: int64(s.PagesScanned), PagesSkippedParent: int64(s.PagesSkippedParent), PagesWritten: int64(s.PagesWritten),
		}
	}
	t := time.Now()
	// Phases are recorded before commit; image write and total are
	// measured around it and added to the result afterwards.
	r.m.Phases = append(r.m.Phases, r.res.Timings...)
	img, err := r.img.Commit(context.WithoutCancel(ctx), r.m)
	if err != nil {
		return nil, fmt.Errorf("write image: %w", err)
	}
	r.res.Timings.Add(PhaseImageWrite, time.Since(t))
	// CRIU exits while the image is hashed and synced; what is left of
	// its exit is counted here.
	t = time.Now()
	r.dr.Wait()
	r.res.Timings.Add(PhaseCRIUExit, time.Since(t))
	r.res.Timings.Add(PhaseTotal, time.Since(r.start))
	r.res.Manifest = img.Manifest
	return r.res, nil
}

// resume tells the app whose hooks ran to go on, with a fresh context:
// ctx may be what failed.
func (r *checkpointRun) resume(reason string) error {
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := r.app.Resume(rctx, reason, 20*time.Second)
	return err
}

// abort resumes the app after a failed checkpoint, if its hooks ran.
func (r *checkpointRun) abort(reason string) {
	if !r.hooksRan {
		return
	}
	if err := r.resume(reason); err != nil {
		r.log.Warn("resume after failed checkpoint", "err", err)
	}
}

// addResources records the hooks' reports, with their carried records, in
// the manifest.
func AddResources(m *images.Manifest, reports []proto.HookReport) {
	for _, r := range reports {
		m.Resources = append(m.Resources, images.ResourceReport{Name: r.Name, DurationNS: int64(r.Duration), Details: r.Details,
			Error: r.Error, RecordsCarried: r.Carried})
		m.RecordsCarried += r.Carried
	}
}

// fatalProblems turns preflight findings into an error. Before the hooks
// only what no hook can fix (MPTCP) counts. A TCP connection left open is
// fatal without tcpClose; the hint never suggests --tcp-close for one that
// kj takes for a Kafka client's.
func fatalProblems(probs []criu.Problem, tcpClose, beforeHooks bool, kj kafkaJudge) error {
	var msgs []string
	hint := ""
	for _, p := range probs {
		switch {
		case p.Cause == criu.CauseMPTCP:
			msgs = append(msgs, p.String())
			hint = criu.CauseMPTCP.Hint()
		case beforeHooks:
		case p.Cause == criu.CauseTCPEstablished && !tcpClose:
			msgs = append(msgs, kj.describe(p))
			switch {
			case hint == criu.CauseMPTCP.Hint():
			case kj.kafka(p):
				hint = kafkaTCPHint
			case hint == "":
				hint = kj.tcpHint()
			}
		case p.Cause == criu.CauseExternalUnix:
			msgs = append(msgs, p.String())
			if hint == "" {
				hint = criu.CauseExternalUnix.Hint()
			}
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return &criu.Error{Op: "dump", First: "CRIU cannot dump " + strings.Join(msgs, ", "), Hint: hint}
}
