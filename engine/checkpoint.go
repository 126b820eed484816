package engine

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
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
	// NoHooks dumps a process that has no kcr control socket.
	NoHooks bool
	// RequireDrained fails the checkpoint (a *HookError whose CarryVeto is
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
	// AfterDump, if set, runs after CRIU's dump and before the image is
	// published (tests kill kcr there; "kcr recover" finishes the image).
	AfterDump func()
	// SignKey, if set, signs the image's manifest (images.SignatureName).
	SignKey ed25519.PrivateKey
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

// HookError is returned when the app's before-checkpoint hooks failed; no
// image was written and the app resumed. It is the contract's type, so that
// client, engine and CLI share one.
type HookError = proto.HookFailure

// Checkpoint runs the app's hooks, dumps it with CRIU and writes an image.
// Whatever fails, the app is resumed and no partial image is left behind.
func Checkpoint(ctx context.Context, o CheckpointOptions) (*CheckpointResult, error) {
	return realSeams.checkpoint(ctx, o)
}

// checkpoint is Checkpoint with the process, the app and CRIU behind s.
func (s seams) checkpoint(ctx context.Context, o CheckpointOptions) (*CheckpointResult, error) {
	log := logger(o.Logger)
	start := time.Now()
	if o.HookBudget <= 0 {
		o.HookBudget = proto.DefaultHookBudget
	}
	if o.ResumeAfter <= 0 {
		o.ResumeAfter = o.HookBudget + 60*time.Second
	}
	proc, err := s.process(o.PID)
	if err != nil {
		return nil, err
	}

	shell := o.ShellJob
	if !shell {
		if need, err := s.shellJobNeeded(o.PID); err == nil && need {
			shell = true
		}
	}
	// CRIU starts now, so that its start-up and version check happen before
	// the app is disturbed, not while it is suspended.
	sess, err := s.openDumper(ctx, o.CRIU, shell)
	if err != nil {
		return nil, err
	}
	defer sess.Close()

	b, err := createImage(o.Output, o.SignKey)
	if err != nil {
		return nil, err
	}
	defer b.Abort() // removes the unfinished image; a no-op once committed

	// CRIU gets the dump request at once: it then probes the kernel (most
	// of a plain "criu dump" where /run keeps no kerndat cache) while kcr
	// runs the preflight and finds the socket. CRIU waits at its pre-dump
	// stage, before it touches the app, until Go; every return before that
	// kills it (deferred Cancel, before Abort).
	pd, err := sess.Begin(criu.DumpOptions{
		PID: o.PID, ImagesDir: b.CRIUDir(), LeaveRunning: o.LeaveRunning,
		ShellJob: shell, FileLocks: true, TCPClose: o.TCPClose, LogLevel: o.CRIULogLevel,
	})
	if err != nil {
		return nil, err
	}
	defer pd.Cancel()
	res := &CheckpointResult{Image: b.Final()}
	res.Timings.add(PhasePrepare, time.Since(start))

	// Sockets CRIU can never dump (MPTCP) are found before any hook runs,
	// so that the app is not disturbed for nothing; without hooks, all
	// that CRIU would refuse is found here, once.
	var kafkaClients []string
	if s.kafkaClients != nil {
		kafkaClients = s.kafkaClients(o.PID)
	}
	kj := newKafkaJudge(o.KafkaPorts, kafkaClients)
	var preProbs []criu.Problem
	if probs, err := s.preflight(o.PID); err == nil {
		preProbs = probs
		if err := fatalProblems(probs, o.TCPClose, !o.NoHooks, kj); err != nil {
			return nil, err
		}
	} else {
		log.Debug("preflight", "err", err)
	}

	var sock appControl
	var sockPath string
	if o.NoHooks {
		if _, p, err := s.findApp(o.PID); err == nil {
			log.Warn("the process has a kcr control socket, but --no-hooks skips its hooks", "socket", p)
		}
	} else {
		sock, sockPath, err = s.findApp(o.PID)
		if err != nil {
			return nil, err
		}
	}

	// CRIU answered its version meanwhile (the request went with its
	// start); a CRIU unfit for this kernel is refused before any hook.
	criuVersion, err := sess.Version()
	if err != nil {
		return nil, err
	}
	// The app is disturbed only once CRIU is ready to seize it: CRIU's
	// preparation (tens of ms where it keeps no kerndat cache) is not part
	// of the time the app's resources stay quiesced.
	t := time.Now()
	if err := pd.Ready(ctx); err != nil {
		return nil, err
	}
	res.Timings.add(PhaseCRIUReady, time.Since(t))

	var reports []proto.HookReport
	hooksRan := false
	// resume tells the app to go on after a failure; with a fresh context,
	// because ctx may be what failed.
	resume := func(reason string) error {
		if !hooksRan {
			return nil
		}
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := sock.Resume(rctx, reason, 20*time.Second)
		if err != nil {
			log.Warn("resume after failed checkpoint", "err", err)
		}
		return err
	}

	if sock != nil {
		t := time.Now()
		m, err := sock.Checkpoint(ctx, client.CheckpointRequest{
			HookBudget: o.HookBudget, ResumeAfter: o.ResumeAfter, LeaveRunning: o.LeaveRunning, RequireDrained: o.RequireDrained})
		res.Timings.add(PhaseHooks, time.Since(t))
		if _, ok := errors.AsType[*HookError](err); ok {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("before-checkpoint hooks: %w", err)
		}
		hooksRan = true
		reports = m.Reports
		// The peer check vouched for the listener; the app must agree on
		// which process it is.
		if m.PID != o.PID {
			resume("checkpoint aborted: the app answered for another PID")
			return nil, fmt.Errorf("%w: %s of PID %d answered ready for PID %d: refusing to dump", client.ErrUnsafeSocket, sockPath, o.PID, m.PID)
		}
	}
	if o.AfterHooks != nil {
		o.AfterHooks()
	}
	if err := ctx.Err(); err != nil {
		resume("checkpoint cancelled")
		return nil, err
	}

	// What is left open after the hooks decides whether CRIU can succeed.
	// Without hooks the first look already judged everything.
	var closedKafka []string
	if !o.NoHooks {
		if probs, err := s.preflight(o.PID); err == nil {
			if err := fatalProblems(probs, o.TCPClose, false, kj); err != nil {
				resume("checkpoint aborted: " + err.Error())
				return nil, err
			}
			if o.TCPClose {
				closedKafka = kj.closedByCRIU(probs)
			}
		}
	} else if o.TCPClose && preProbs != nil {
		closedKafka = kj.closedByCRIU(preProbs)
	}
	if len(closedKafka) > 0 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("--tcp-close drops Kafka connections that no hook closed (%s): the image keeps the client's producer id, sequence numbers and group membership; restore one copy only (kcr refuses --count > 1 without --allow-duplicates), and wrap the client with kafkahooks or kgohooks", strings.Join(closedKafka, "; ")))
	}

	// The draft manifest lets "kcr recover" finish the image if kcr dies
	// after the dump and before the image is published.
	m := &images.Manifest{
		KCRVersion:    Version,
		CRIUVersion:   criuVersion.String(),
		Kernel:        kernel(),
		Host:          hostname(),
		Process:       proc,
		ControlSocket: sockPath,
		NoHooks:       o.NoHooks,
		Options:       images.Options{LeaveRunning: o.LeaveRunning, TCPClose: o.TCPClose, ShellJob: shell, FileLocks: true, TCPClosedKafka: closedKafka},
	}
	addResources(m, reports)
	t = time.Now()
	if err := b.WritePending(m); err != nil {
		resume("checkpoint aborted: " + err.Error())
		return nil, err
	}
	res.Timings.add(PhaseDraft, time.Since(t))

	t = time.Now()
	dr, err := pd.Go(ctx)
	res.Timings.add(PhaseFreezeDump, time.Since(t))
	if err != nil {
		resume("dump failed: " + err.Error())
		return nil, err
	}
	defer dr.Wait() // on every return; normally already done below
	pause := time.Since(start)
	if o.AfterDump != nil {
		o.AfterDump()
	}

	if o.LeaveRunning {
		t := time.Now()
		if hooksRan {
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, res.ResumeErr = sock.Resume(rctx, "leave-running", 20*time.Second)
			cancel()
		}
		res.Timings.add(PhaseResume, time.Since(t))
	} else if !proc.PIDNamespace {
		// The process must really be gone before the image is declared done:
		// a restore on this host needs its PID. (Init of its own PID
		// namespace is restored into a new namespace and needs no PID.)
		t := time.Now()
		if _, err := s.waitGone(ctx, o.PID, 10*time.Second); err != nil {
			res.Warnings = append(res.Warnings, fmt.Sprintf("dumped process %d did not exit: %v", o.PID, err))
		}
		res.Timings.add(PhaseExit, time.Since(t))
	}
	_ = pause

	if s := dr.Stats; s != nil {
		m.CRIUStats = images.CRIUStats{
			FreezingTimeUS: s.FreezingTime.Microseconds(), FrozenTimeUS: s.FrozenTime.Microseconds(),
			MemdumpTimeUS: s.MemdumpTime.Microseconds(), MemwriteTimeUS: s.MemwriteTime.Microseconds(),
			PagesScanned: int64(s.PagesScanned), PagesSkippedParent: int64(s.PagesSkippedParent), PagesWritten: int64(s.PagesWritten),
		}
	}
	t = time.Now()
	// Phases are recorded before commit; image write and total are
	// measured around it and added to the result afterwards.
	m.Phases = append(m.Phases, res.Timings...)
	img, err := b.Commit(context.WithoutCancel(ctx), m)
	if err != nil {
		return nil, fmt.Errorf("write image: %w", err)
	}
	res.Timings.add(PhaseImageWrite, time.Since(t))
	// CRIU exits while the image is hashed and synced; what is left of
	// its exit is counted here.
	t = time.Now()
	dr.Wait()
	res.Timings.add(PhaseCRIUExit, time.Since(t))
	res.Timings.add(PhaseTotal, time.Since(start))
	res.Manifest = img.Manifest
	return res, nil
}

// addResources records the hooks' reports, with their carried records, in
// the manifest.
func addResources(m *images.Manifest, reports []proto.HookReport) {
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
