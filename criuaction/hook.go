// Package criuaction makes kcr the CRIU action script of container
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
package criuaction

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

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
	// LeaveRunning: the tree goes on after the dump, so the apps' hooks
	// are told (notify.LeaveRunning). EnvFromOS sets it from
	// EnvLeaveRunning or from the runtime's command line (leaveRunning).
	LeaveRunning bool
}

// EnvFromOS reads Env from this process's environment.
func EnvFromOS() (Env, error) {
	e := Env{Action: os.Getenv("CRTOOLS_SCRIPT_ACTION"), ImageDir: os.Getenv("CRTOOLS_IMAGE_DIR"), CRIUPID: os.Getppid()}
	e.LeaveRunning = os.Getenv(EnvLeaveRunning) == "1" || leaveRunning("/proc", e.CRIUPID)
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
	// StateDir holds the watcher's state (default /run/kcr/criu-hook; when
	// not root, $XDG_RUNTIME_DIR/kcr-criu-hook, else
	// $TMPDIR/kcr-criu-hook-UID). It must be a directory of the effective
	// uid closed to others, else the hook refuses to use it.
	StateDir string
	// SpawnWatcher starts the watcher for a state file, detached, while
	// the hooks run (so that its start costs CRIU no time). The watcher
	// waits for commit: true once the state file is written, false (no
	// checkpoint to watch: it exits) otherwise. The default runs this
	// executable as "criu-hook watch FILE", gated by a pipe on its stdin.
	SpawnWatcher func(stateFile string) (commit func(ok bool), err error)
	Logger       *slog.Logger // default: discard
}

func (o *Options) defaults() {
	if o.HookBudget <= 0 {
		o.HookBudget = proto.DefaultHookBudget
	}
	if o.ResumeAfter <= 0 {
		o.ResumeAfter = proto.ResumeAfterFor(o.HookBudget)
	}
	if o.AfterWait <= 0 {
		o.AfterWait = 10 * time.Second
	}
	if o.StateDir == "" {
		o.StateDir = defaultStateDir()
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
	PID       int                `json:"pid"`               // host PID
	StartTime uint64             `json:"start_time"`        // from /proc/PID/stat, to tell a reused PID
	Socket    string             `json:"socket"`            // its control socket's path
	Reports   []proto.HookReport `json:"reports,omitempty"` // its hooks' reports
	Error     string             `json:"error,omitempty"`   // why its hooks failed, "" if they did not
}

// Result says what Run did.
type Result struct {
	Action    string   `json:"action"`    // CRIU's stage (Env.Action)
	InitPID   int      `json:"init_pid"`  // the tree's root (Env.InitPID)
	Processes int      `json:"processes"` // in the tree
	Targets   []Target `json:"targets"`   // of them, those with a control socket
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
		case errors.Is(err, client.ErrNoSocket), errors.Is(err, proto.ErrNoProcess):
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
