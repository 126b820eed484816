package notify

import (
	"log/slog"
	"time"
)

// Opt configures a Server (Start). Options are values of an interface,
// as in franz-go, so that they can be listed, wrapped and compared in tests.
type Opt interface {
	apply(*serverConfig)
}

type serverOpt struct{ fn func(*serverConfig) }

func (o serverOpt) apply(c *serverConfig) { o.fn(c) }

type serverConfig struct {
	path        string
	dir         string
	log         *slog.Logger
	maxSuspend  time.Duration
	maxBudget   time.Duration
	pollEvery   time.Duration
	restoreWait time.Duration
	afterBudget time.Duration
	keepHeap    bool // WithFreeHeapBeforeDump(false)
	// instance names this process instance (instanceKey); a field so that
	// tests can fake a restore, which needs CRIU otherwise.
	instance func(pid int) (uint64, error)
	// hostPID reads the process's host PID; a field so that tests can fake
	// the new PID of a restored copy.
	hostPID func() int
}

// defaultRestoreGrace is WithRestoreGrace's default.
const defaultRestoreGrace = 2 * time.Second

func defaultServerConfig() serverConfig {
	return serverConfig{
		log:         slog.Default(),
		maxSuspend:  DefaultMaxSuspend,
		maxBudget:   DefaultMaxHookBudget,
		pollEvery:   25 * time.Millisecond,
		restoreWait: defaultRestoreGrace,
		afterBudget: DefaultAfterBudget,
		instance:    instanceKey,
		hostPID:     hostPID,
	}
}

// WithSocketPath binds the control socket at path. Its base name must start
// with "kcr-" and end in ".sock", so that kcr can find it from the PID.
// Default: kcr-<pid>.sock in the directory of WithSocketDir.
func WithSocketPath(path string) Opt {
	return serverOpt{func(c *serverConfig) { c.path = path }}
}

// WithSocketDir binds the control socket as kcr-<pid>.sock in dir, which is
// created with mode 0700. Default: $KCR_SOCKET_DIR, else /run/kcr for root,
// else $XDG_RUNTIME_DIR/kcr, else $TMPDIR/kcr-<uid>.
func WithSocketDir(dir string) Opt {
	return serverOpt{func(c *serverConfig) { c.dir = dir }}
}

// WithLogger sets the logger. Default: slog.Default().
func WithLogger(l *slog.Logger) Opt {
	return serverOpt{func(c *serverConfig) { c.log = l }}
}

// WithMaxSuspend caps how long the app waits for kcr's follow-up after its
// before-checkpoint hooks ran, whatever the CLI asks. Default:
// DefaultMaxSuspend (5 minutes).
func WithMaxSuspend(d time.Duration) Opt {
	return serverOpt{func(c *serverConfig) { c.maxSuspend = d }}
}

// WithMaxHookBudget caps the budget of the before-checkpoint hooks, whatever
// the CLI asks; a larger request is clamped to it and logged. Default:
// DefaultMaxHookBudget (2 minutes).
func WithMaxHookBudget(d time.Duration) Opt {
	return serverOpt{func(c *serverConfig) { c.maxBudget = d }}
}

// WithRestoreGrace sets how long a process that detected by itself that it
// was restored waits for kcr's after-restore message (which carries the
// restore generation) before running its hooks anyway. Default: 2 s.
func WithRestoreGrace(d time.Duration) Opt {
	return serverOpt{func(c *serverConfig) { c.restoreWait = d }}
}

// WithAfterBudget bounds the after-restore phase when kcr does not say.
// Default: DefaultAfterBudget (30 s).
func WithAfterBudget(d time.Duration) Opt {
	return serverOpt{func(c *serverConfig) { c.afterBudget = d }}
}

// WithFreeHeapBeforeDump sets whether the app, once its before-checkpoint
// hooks succeeded, collects its garbage and returns the heap's free pages
// to the kernel (debug.FreeOSMemory) before it answers ready: CRIU dumps,
// and every restore reads back, only the pages the process holds, and a
// Go heap keeps up to its goal (twice the live heap with GOGC=100) until
// its scavenger returns the rest, slowly. It costs one collection in the
// checkpoint. Default: true.
func WithFreeHeapBeforeDump(on bool) Opt {
	return serverOpt{func(c *serverConfig) { c.keepHeap = !on }}
}
