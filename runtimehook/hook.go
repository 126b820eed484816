// Package runtimehook makes kcr the CRIU action script of container
// runtimes (runc, and through it Podman, CRI-O and the kubelet's checkpoint
// API), so that a runtime's checkpoint runs the app's kcr hooks.
//
// CRIU runs its action script at every stage of a dump or restore, with
// CRTOOLS_SCRIPT_ACTION naming the stage and CRTOOLS_INIT_PID the host PID of
// the tree's root. Run handles the stages kcr cares about:
//
//   - pre-dump, before CRIU seizes the tree: the before-checkpoint hooks of
//     every process of the tree that has a kcr control socket. If one fails,
//     every process is resumed and Run fails, so that CRIU aborts the dump.
//     Otherwise a detached watcher is left behind: CRIU runs no script when
//     a dump fails or leaves the tree running, so the watcher waits for CRIU
//     to exit and sends Resume to every process that is still there.
//   - post-dump: records that the dump succeeded, for the watcher's logs.
//   - post-resume, once a restored tree runs: the after-restore message
//     (Restore) to every process of the tree with a control socket.
//
// Every other stage is a no-op. Run never blocks CRIU longer than the hook
// budget plus a few seconds; the app resumes by itself if the watcher is
// lost (notify's resume-after rule).
package runtimehook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// ScriptName is the file name under which the kcr binary runs as CRIU's
// action script (a symbolic link to kcr): CRIU passes a script no arguments.
const ScriptName = "kcr-criu-hook"

// CRIU's action names (CRTOOLS_SCRIPT_ACTION) that Run acts on.
const (
	ActionPreDump     = "pre-dump"
	ActionPostDump    = "post-dump"
	ActionPostRestore = "post-restore"
	ActionPostResume  = "post-resume"
)

// Env is CRIU's action-script environment.
type Env struct {
	Action   string // CRTOOLS_SCRIPT_ACTION
	InitPID  int    // CRTOOLS_INIT_PID: host PID of the tree's root (0 if CRIU did not set it)
	ImageDir string // CRTOOLS_IMAGE_DIR: CRIU's images, as /proc/<criu>/fd/<n>
	CRIUPID  int    // the process that ran the script: CRIU
}

// EnvFromOS reads Env from this process's environment.
func EnvFromOS() (Env, error) {
	e := Env{Action: os.Getenv("CRTOOLS_SCRIPT_ACTION"), ImageDir: os.Getenv("CRTOOLS_IMAGE_DIR"), CRIUPID: os.Getppid()}
	if e.Action == "" {
		return e, errors.New("CRTOOLS_SCRIPT_ACTION is not set: kcr criu-hook is run by CRIU as its action script (install it with kcr install-runtime-hook)")
	}
	if s := os.Getenv("CRTOOLS_INIT_PID"); s != "" {
		pid, err := strconv.Atoi(s)
		if err != nil || pid <= 0 {
			return e, fmt.Errorf("CRTOOLS_INIT_PID=%q is not a PID", s)
		}
		e.InitPID = pid
	}
	return e, nil
}

// Options configures Run and Watch.
type Options struct {
	// HookBudget bounds the before-checkpoint hooks (default 10 s).
	HookBudget time.Duration
	// ResumeAfter is how long an app waits for the watcher after its hooks
	// before it resumes by itself (default HookBudget + 60 s).
	ResumeAfter time.Duration
	// RequireDrained asks the apps for a checkpoint in which no resource
	// carries records (notify.CarryError vetoes it otherwise).
	RequireDrained bool
	// AfterWait is how long post-resume waits for the after-restore hooks
	// before it leaves them running (default 10 s).
	AfterWait time.Duration
	// StateDir holds the watcher's state (default /run/kcr/criu-hook, or
	// $TMPDIR/kcr-criu-hook when not root).
	StateDir string
	// SpawnWatcher starts the watcher for a state file, detached, while
	// the hooks run (so that its start costs CRIU no time). The watcher
	// waits for commit: true once the state file is written, false (no
	// checkpoint to watch: it exits) otherwise. The default runs this
	// executable as "criu-hook watch FILE", gated by a pipe on its stdin.
	SpawnWatcher func(stateFile string) (commit func(ok bool), err error)
	Logger       *slog.Logger
}

func (o *Options) defaults() {
	if o.HookBudget <= 0 {
		o.HookBudget = proto.DefaultHookBudget
	}
	if o.ResumeAfter <= 0 {
		o.ResumeAfter = o.HookBudget + 60*time.Second
	}
	if o.AfterWait <= 0 {
		o.AfterWait = 10 * time.Second
	}
	if o.StateDir == "" {
		o.StateDir = filepath.Join(os.TempDir(), "kcr-criu-hook")
		if os.Geteuid() == 0 {
			o.StateDir = "/run/kcr/criu-hook"
		}
	}
	if o.SpawnWatcher == nil {
		o.SpawnWatcher = spawnWatcher
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// sock is t's control socket, reached and checked through t.PID.
func (t Target) sock() *client.Socket { return &client.Socket{PID: t.PID, Path: t.Socket} }

// Target is a process of the tree with a kcr control socket.
type Target struct {
	PID       int                `json:"pid"`
	StartTime uint64             `json:"start_time"`
	Socket    string             `json:"socket"`
	Reports   []proto.HookReport `json:"reports,omitempty"`
	Error     string             `json:"error,omitempty"`
}

// Result says what Run did.
type Result struct {
	Action    string   `json:"action"`
	InitPID   int      `json:"init_pid"`
	Processes int      `json:"processes"` // in the tree
	Targets   []Target `json:"targets"`   // of them, those with a control socket
}

// FailedMarker is in the log line and the error of failed before-checkpoint
// hooks, for those who see only CRIU's log or the runtime's message.
const FailedMarker = "before-checkpoint hooks failed"

// HookError is returned when before-checkpoint hooks failed: nothing may be
// dumped, and every process was resumed.
type HookError struct{ Failed []Target }

func (e *HookError) Error() string {
	var s []string
	for _, t := range e.Failed {
		s = append(s, fmt.Sprintf("PID %d: %s", t.PID, t.Error))
	}
	return FailedMarker + ", the dump must not go on, every app resumed: " + strings.Join(s, "; ")
}

// Run handles one action-script call of CRIU.
func Run(ctx context.Context, env Env, o Options) (*Result, error) {
	o.defaults()
	res := &Result{Action: env.Action, InitPID: env.InitPID}
	switch env.Action {
	case ActionPreDump:
		return res, preDump(ctx, env, o, res)
	case ActionPostDump:
		return res, postDump(env, o)
	case ActionPostRestore:
		return res, postRestore(env, o)
	case ActionPostResume:
		return res, postResume(ctx, env, o, res)
	}
	return res, nil
}

// targets lists the processes of env's tree that have a control socket,
// and logs when there is none.
func targets(env Env, o Options, res *Result) ([]Target, error) {
	if env.InitPID <= 0 {
		return nil, fmt.Errorf("%s: CRTOOLS_INIT_PID is not set: use CRIU >= 3.19, which sets it for every action", env.Action)
	}
	pids := procfs.Tree(env.InitPID)
	res.Processes = len(pids)
	var ts []Target
	for _, pid := range pids {
		sock, err := client.Find(pid)
		switch {
		case errors.Is(err, client.ErrNoSocket), errors.Is(err, client.ErrNoProcess):
			continue
		case err != nil:
			return nil, err
		}
		st, err := procfs.StartTime(pid)
		if err != nil {
			continue // exited meanwhile
		}
		ts = append(ts, Target{PID: pid, StartTime: st, Socket: sock.Path})
	}
	if len(ts) == 0 {
		o.Logger.Info(env.Action+": no kcr control socket in the process tree, nothing to do", "init_pid", env.InitPID, "processes", res.Processes)
	}
	return ts, nil
}

func preDump(ctx context.Context, env Env, o Options, res *Result) error {
	log := o.Logger
	ts, err := targets(env, o, res)
	if err != nil || len(ts) == 0 {
		return err
	}
	// The watcher starts while the hooks run: it waits for the outcome.
	type spawned struct {
		commit func(bool)
		err    error
	}
	file := stateFile(o, env.CRIUPID)
	watcher := make(chan spawned, 1)
	go func() {
		c, err := o.SpawnWatcher(file)
		watcher <- spawned{c, err}
	}()
	// Every app quiesces at once: the pause is the slowest app's, not the sum.
	hctx, cancel := context.WithTimeout(ctx, o.HookBudget+5*time.Second)
	defer cancel()
	ready := make([]bool, len(ts))
	var wg sync.WaitGroup
	for i := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			m, err := ts[i].sock().Checkpoint(hctx, client.CheckpointRequest{HookBudget: o.HookBudget, ResumeAfter: o.ResumeAfter, RequireDrained: o.RequireDrained})
			ts[i].Reports = m.Reports
			if err != nil {
				ts[i].Error = err.Error()
				var hf *proto.HookFailure
				if errors.As(err, &hf) {
					ts[i].Error, ts[i].Reports = hf.Msg, hf.Reports
				}
				log.Warn("pre-dump: "+FailedMarker, "pid", ts[i].PID, "err", ts[i].Error)
				return
			}
			ready[i] = true
			log.Info("pre-dump: before-checkpoint hooks done", "pid", ts[i].PID, "socket", ts[i].Socket, "took", time.Since(t).Round(time.Microsecond), "hooks", len(m.Reports))
		}()
	}
	wg.Wait()
	res.Targets = ts

	var failed []Target
	for i, t := range ts {
		if !ready[i] {
			failed = append(failed, t)
		}
	}
	w := <-watcher
	if len(failed) == 0 {
		writeReports(env, res, o)
		dir, _ := os.Readlink(env.ImageDir) // CRIU's fd: gone when the watcher looks
		err := w.err
		if err == nil {
			_, err = writeState(o, state{CRIUPID: env.CRIUPID, CRIUStart: startTime(env.CRIUPID), InitPID: env.InitPID,
				Targets: ts, Deadline: time.Now().Add(o.ResumeAfter), ImageDir: dir})
			w.commit(err == nil)
		}
		if err == nil {
			return nil
		}
		// Without a watcher nobody would resume the apps after a failed
		// dump: abort it rather than leave them waiting.
		for i := range ts {
			ts[i].Error = "cannot start the resume watcher: " + err.Error()
		}
		failed = ts
	} else if w.err == nil {
		w.commit(false)
	}
	// The failed targets' reports too: kcr checkpoint --container reads in
	// them which hook failed, rather than guessing from CRIU's log.
	writeReports(env, res, o)
	resumeAll(ts, ready, "checkpoint aborted: "+(&HookError{Failed: failed}).Error(), o)
	return &HookError{Failed: failed}
}

// writeReports keeps the hooks' reports beside CRIU's images, for the
// manifest of "kcr checkpoint --container", or, when hooks failed, for its
// error (the targets' Error).
func writeReports(env Env, res *Result, o Options) {
	if env.ImageDir == "" {
		return
	}
	b, err := json.Marshal(res)
	if err == nil {
		err = os.WriteFile(filepath.Join(env.ImageDir, ReportsFile), b, 0o600)
	}
	if err != nil {
		o.Logger.Debug("pre-dump: reports not kept", "err", err)
	}
}

// resumeAll tells the processes whose hooks ran that the checkpoint is
// over, with a fresh context: the caller's may be what ended.
func resumeAll(ts []Target, which []bool, reason string, o Options) {
	ctx, cancel := context.WithTimeout(context.Background(), o.AfterWait+5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, t := range ts {
		if !which[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := t.sock().Resume(ctx, reason, o.AfterWait)
			o.Logger.Log(ctx, level(err), "resumed", "pid", t.PID, "reason", reason, "err", err)
		}()
	}
	wg.Wait()
}

func level(err error) slog.Level {
	if err != nil {
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

func postDump(env Env, o Options) error {
	p := stateFile(o, env.CRIUPID)
	st, err := readState(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil // no app had hooks
	}
	if err != nil {
		return err
	}
	st.Dumped = true
	_, err = writeState(o, st)
	return err
}

func postResume(ctx context.Context, env Env, o Options, res *Result) error {
	log := o.Logger
	ts, err := targets(env, o, res)
	if err != nil || len(ts) == 0 {
		return err
	}
	gen := takeGeneration(env, o)
	actx, cancel := context.WithTimeout(ctx, o.AfterWait+5*time.Second)
	defer cancel()
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			m, err := ts[i].sock().RestoredAs(actx, gen, "", o.AfterWait)
			ts[i].Reports = m.Reports
			switch {
			case errors.Is(err, client.ErrPending):
				log.Warn("post-resume: after-restore hooks still running; the app goes on with them", "pid", ts[i].PID, "after", o.AfterWait)
			case err != nil:
				ts[i].Error = err.Error()
				errs[i] = fmt.Errorf("PID %d: %w", ts[i].PID, err)
				log.Warn("post-resume: after-restore hooks", "pid", ts[i].PID, "err", err)
			default:
				log.Info("post-resume: restored", "pid", ts[i].PID, "generation", gen, "instance_id", m.InstanceID, "took", time.Since(t).Round(time.Microsecond))
			}
		}()
	}
	wg.Wait()
	res.Targets = ts
	return errors.Join(errs...)
}

// postRestore counts the restore. The restored tree is still stopped and
// could not answer: the message goes at post-resume, when CRIU has already
// closed its images directory, so the count is kept until then.
func postRestore(env Env, o Options) error {
	if env.ImageDir == "" || os.Getenv(GenerationEnv) != "" {
		return nil
	}
	// The restore counter lives beside CRIU's images, as in a kcr image.
	gen, err := images.NextGeneration(env.ImageDir)
	if err != nil {
		o.Logger.Debug("post-restore: no restore counter", "err", err)
		return nil
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil
	}
	os.WriteFile(generationFile(o, env.CRIUPID), []byte(strconv.FormatUint(gen, 10)), 0o600)
	return nil
}

// GenerationEnv, in the runtime's environment (which CRIU passes to its
// script), gives the restore's generation: "kcr restore --container" counts
// restores in the kcr image, as "kcr restore" does.
const GenerationEnv = "KCR_HOOK_GENERATION"

// ReportsFile is what pre-dump writes beside CRIU's images: the hooks'
// reports, for the manifest of "kcr checkpoint --container".
const ReportsFile = "kcr-hooks.json"

func generationFile(o Options, criuPID int) string {
	return filepath.Join(o.StateDir, "restore-"+strconv.Itoa(criuPID))
}

// takeGeneration returns the count postRestore kept for this CRIU, or
// counts now if it could not (a direct call with the images still there).
func takeGeneration(env Env, o Options) uint64 {
	if g, err := strconv.ParseUint(os.Getenv(GenerationEnv), 10, 64); err == nil {
		return g
	}
	p := generationFile(o, env.CRIUPID)
	if b, err := os.ReadFile(p); err == nil {
		os.Remove(p)
		if g, err := strconv.ParseUint(string(b), 10, 64); err == nil {
			return g
		}
	}
	if env.ImageDir != "" {
		if g, err := images.NextGeneration(env.ImageDir); err == nil {
			return g
		}
	}
	return 0
}

func startTime(pid int) uint64 {
	st, _ := procfs.StartTime(pid)
	return st
}

// spawnWatcher runs this executable as "criu-hook watch FILE" in a session
// of its own. It inherits stderr (CRIU's log) and, as stdin, a pipe that
// commit closes: Watch reads the outcome there first.
func spawnWatcher(file string) (func(bool), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, "criu-hook", "watch", file)
	cmd.Stdin, cmd.Stderr = r, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start %s criu-hook watch: %w", exe, err)
	}
	cmd.Process.Release()
	return func(ok bool) {
		if ok {
			w.Write([]byte(watchGo))
		}
		w.Close()
	}, nil
}

// watchGo, on the watcher's gate, says the state file is written.
const watchGo = "go"
