package criuaction

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kcr-dev/kcr/notify/proto"
)

// Environment variables of the action script: CRIU passes a script no
// arguments, but the runtime's environment.
const (
	EnvHookBudget  = "KCR_HOOK_BUDGET"       // Options.HookBudget
	EnvResumeAfter = "KCR_HOOK_RESUME_AFTER" // Options.ResumeAfter
	EnvAfterWait   = "KCR_HOOK_AFTER_WAIT"   // Options.AfterWait
	EnvStateDir    = "KCR_HOOK_STATE_DIR"    // Options.StateDir
	// EnvRequireDrained, set to 1 (kcr checkpoint --container
	// --require-drained), sets Options.RequireDrained.
	EnvRequireDrained = "KCR_HOOK_REQUIRE_DRAINED"
	EnvDebug          = "KCR_HOOK_DEBUG" // log at debug level
	// EnvLeaveRunning, set to 1, tells the hook that the tree goes on
	// after the dump (Env.LeaveRunning), for a caller of CRIU whose
	// command line does not say so.
	EnvLeaveRunning = "KCR_HOOK_LEAVE_RUNNING"
	// EnvTimeout is EnvHookBudget's former name, read when EnvHookBudget is
	// unset, so that runtime configurations that set it keep working.
	EnvTimeout = "KCR_HOOK_TIMEOUT"
)

// OptionsFromEnv returns the options the environment sets; unset ones
// keep Run's defaults.
func OptionsFromEnv() Options {
	d := func(name string) time.Duration {
		if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return 0
	}
	return Options{HookBudget: cmp.Or(d(EnvHookBudget), d(EnvTimeout)), ResumeAfter: d(EnvResumeAfter), AfterWait: d(EnvAfterWait), StateDir: os.Getenv(EnvStateDir), RequireDrained: os.Getenv(EnvRequireDrained) == "1"}
}

// Logger logs to stderr, which is CRIU's log (dump.log, restore.log), the
// file the runtime names when it fails.
func Logger(debug bool) *slog.Logger {
	lvl := slog.LevelInfo
	if debug || os.Getenv(EnvDebug) != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})).With("src", "kcr-criu-hook")
}

// Exit codes of Main, those of kcr.
const (
	exitErr   = 1
	exitUsage = 2
	exitHooks = 3
)

// Main is the action script as a program (cmd/kcr-hook): with no
// arguments, it handles CRIU's call of the environment; "[criu-hook] watch
// FILE" is the resume watcher that pre-dump starts. It returns the exit code: 3 when
// hooks failed, so that CRIU aborts the dump.
func Main(ctx context.Context, args []string) int {
	o := OptionsFromEnv()
	o.Logger = Logger(false)
	if len(args) > 0 && args[0] == "criu-hook" {
		args = args[1:] // as spawnWatcher starts kcr
	}
	if len(args) == 2 && args[0] == "watch" {
		if err := Watch(ctx, args[1], os.Stdin, o); err != nil {
			o.Logger.Warn("watch", "err", err)
			return exitErr
		}
		return 0
	}
	if len(args) != 0 {
		o.Logger.Error("usage: kcr-hook (run by CRIU as its action script) or kcr-hook watch FILE")
		return exitUsage
	}
	_, err := RunFromEnv(ctx, o)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrNoEnv):
		return exitUsage
	}
	if _, ok := errors.AsType[*proto.HookFailure](err); ok {
		return exitHooks
	}
	return exitErr
}

// ErrNoEnv: the environment is not that of a CRIU action script.
var ErrNoEnv = errors.New("not run by CRIU")

// RunFromEnv handles the CRIU call that the environment describes
// (EnvFromOS) and logs the outcome to o.Logger.
func RunFromEnv(ctx context.Context, o Options) (*Result, error) {
	env, err := EnvFromOS()
	if err != nil {
		o.Logger.Error(err.Error())
		return nil, fmt.Errorf("%w: %w", ErrNoEnv, err)
	}
	t := time.Now()
	res, err := Run(ctx, env, o)
	if err != nil {
		o.Logger.Error(env.Action+" failed", "err", err, "took", time.Since(t).Round(time.Microsecond))
		return res, err
	}
	o.Logger.Debug(env.Action+" done", "targets", len(res.Targets), "took", time.Since(t).Round(time.Microsecond))
	return res, nil
}
