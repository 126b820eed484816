package standby

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// proc names a running service: its host PID and start time (a PID alone
// may be reused).
type proc struct {
	PID   int
	Start uint64
}

// backend is what the supervisor does to the service; engineBackend is the
// real one, tests use fakes.
type backend interface {
	// start starts the service cold and waits for its control socket.
	start(ctx context.Context) (proc, error)
	// checkpoint runs the hooks (require-drained) and dumps p into the
	// image dir/name; on error the service runs on.
	checkpoint(ctx context.Context, p proc, dir, name string) error
	// restore restores the image dir/name as a new instance.
	restore(ctx context.Context, dir, name string) (proc, error)
	// activity reads the service's activity counter.
	activity(ctx context.Context, p proc) (notify.Activity, error)
	// alive reports whether p still runs.
	alive(p proc) bool
	// copies lists the copies of the service that run now, whoever
	// started or restored them.
	copies() []proc
	// ready waits for p's control socket (Options.ReadyTimeout).
	ready(ctx context.Context, p proc) error
	// killCopy kills p and waits until it is gone.
	killCopy(p proc)
	// exitStatus is how p ended, once it is gone (exits.go).
	exitStatus(p proc) exitInfo
	// stop stops p gracefully (SIGTERM), killing it if it is still
	// there when ctx ends; it reports whether it killed it.
	stop(ctx context.Context, p proc) (killed bool)

	// adoptCopies makes kcr standby the parent of every copy it restores
	// (a child subreaper), so that their exits are seen (exits.go).
	adoptCopies()
	// prepare starts the restore of the image dir/name ahead of a wake,
	// where the backend can (ahead.go); dropPrepared drops it.
	prepare(ctx context.Context, dir, name string)
	dropPrepared()
	// exe reads the executable p runs: its path, size and SHA-256, and
	// whether it was replaced under p; path "" where the backend cannot
	// tell (upgrade.go).
	exe(p proc) (path string, size int64, sum string, replaced bool, err error)
	// lastRestore is the phases of the last restore and whether it was
	// prepared ahead; known is false where the backend does not time
	// them (wakephases.go).
	lastRestore() (t engine.Timings, prepared, known bool)
	// listenFiles are the --listen sockets handed to the service.
	listenFiles() []*os.File
	// close releases what the backend holds, the service's output
	// drained, before kcr standby exits.
	close()
}

// engineBackend drives the service through package engine.
type engineBackend struct {
	o      *Options
	log    *slog.Logger
	socket *client.Socket // cached control socket of the current process
	extra  []*os.File     // handed to the service (LISTEN_FDS)
	// fdsSocket hands extra back to the service after a checkpoint
	// (notify.ListenFDsSocketEnv).
	fdsSocket string
	dir       string // the image directory (absolute): markerEnv's value

	kdat          *criu.KdatCache              // CRIU's kernel probe, kept (ahead.go)
	preparing     chan *engine.PreparedRestore // the restore of preparedImage, prepared ahead (nil on failure)
	preparedImage string
	lastTimings   engine.Timings // the phases of the last restore
	lastPrepared  bool           // the last restore was prepared ahead

	lazy     proc   // the lazy-pages daemon of the last restore (lazy.go)
	lazyWork string // its work directory

	sockMu sync.Mutex // socket: activity is read by the watch and by watchFirstActivity

	exits *exits // how each copy kcr reaps ended

	out *serviceOutput // the service's stdout and stderr with --log - (nil: a file)
}

// outputDrain bounds the wait for the service's last lines at exit.
const outputDrain = 5 * time.Second

// stdio returns the write ends of the service's output pipes (nil: it
// writes to Options.Log).
func (b *engineBackend) stdio() (stdout, stderr *os.File) {
	if b.out == nil {
		return nil, nil
	}
	return b.out.stdout, b.out.stderr
}

func (b *engineBackend) start(ctx context.Context) (proc, error) {
	env := append([]string{}, b.o.Env...)
	env = append(env, markerEnv+"="+b.dir)
	if len(b.extra) > 0 {
		// The service is init of its PID namespace: PID 1 is its getpid().
		env = append(env, fmt.Sprintf("LISTEN_FDS=%d", len(b.extra)), "LISTEN_PID=1", "LISTEN_FDNAMES=kcr-standby",
			notify.ListenFDsSocketEnv+"="+b.fdsSocket)
	}
	stdout, stderr := b.stdio()
	res, err := engine.Run(ctx, engine.RunOptions{Args: b.o.Args, Log: b.o.Log, Stdout: stdout, Stderr: stderr, Env: env,
		ReadyTimeout: b.o.ReadyTimeout, ExtraFiles: b.extra, Cred: b.o.Cred, Caps: b.o.Caps, AllCaps: b.o.AllCaps})
	if err != nil {
		if res != nil && res.PID > 0 {
			// It runs but opened no control socket in time: it could
			// never be checkpointed, so it must not be left behind.
			killTree(res.PID)
		}
		return proc{}, err
	}
	b.exits.started(res.PID, res.Exited)
	st, err := procfs.StartTime(res.PID)
	if err != nil {
		return proc{}, fmt.Errorf("started %s as PID %d, which exited already: see %s", b.o.Args[0], res.PID, cmp.Or(res.Log, "its output on kcr standby's stdout and stderr"))
	}
	b.forgetSocket()
	return proc{PID: res.PID, Start: st}, nil
}

// forgetSocket drops the cached control socket: the service moved.
func (b *engineBackend) forgetSocket() {
	b.sockMu.Lock()
	b.socket = nil
	b.sockMu.Unlock()
}

func (b *engineBackend) checkpoint(ctx context.Context, p proc, dir, name string) error {
	if err := b.waitLazy(ctx); err != nil {
		return err
	}
	_, err := engine.Checkpoint(ctx, engine.CheckpointOptions{
		PID: p.PID, Output: dir + "/" + name, HookBudget: b.o.HookBudget, RequireDrained: true, Abandonable: true,
		CRIU: b.o.CRIU, Logger: b.log, KeepFailedLog: dir + "/" + failedDumpLogName,
	})
	return err
}

func (b *engineBackend) restore(ctx context.Context, dir, name string) (proc, error) {
	var res *engine.RestoreResult
	var err error
	pr := b.takePrepared(name)
	b.lastPrepared = pr != nil
	if pr != nil {
		var rs []*engine.RestoreResult
		if rs, err = pr.Restore(ctx); err == nil {
			res = rs[0]
		}
	} else {
		res, err = engine.Restore(ctx, b.restoreOptions(dir, name))
	}
	if err != nil {
		return proc{}, err
	}
	// A lazy restore's work directory is another (waitLazy removes it).
	os.RemoveAll(restoreWorkDir(dir, name))
	b.forgetSocket()
	b.lastTimings = res.Timings
	if res.LazyPID > 0 {
		b.noteLazy(res.LazyPID, lazyWorkDir(dir, name))
	}
	st, err := procfs.StartTime(res.PID)
	p := proc{PID: res.PID, Start: st}
	if err == nil {
		b.exits.restored(p)
	}
	if err != nil || !alive(p) {
		return proc{PID: res.PID}, fmt.Errorf("restored PID %d, gone before its restore was over (after-restore hooks: %v): %w", res.PID, res.HookErr, errExitedInRestore)
	}
	if res.HookErr != nil {
		b.log.Warn("restored, but the after-restore hooks failed; the service runs", "pid", res.PID, "err", res.HookErr)
	}
	return p, nil
}

func (b *engineBackend) activity(ctx context.Context, p proc) (notify.Activity, error) {
	b.sockMu.Lock()
	defer b.sockMu.Unlock()
	if b.socket == nil || b.socket.PID != p.PID {
		s, err := client.Find(p.PID)
		if err != nil {
			return notify.Activity{}, err
		}
		b.socket = s
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := b.socket.Activity(ctx)
	if err != nil {
		b.socket = nil // found again next time: a restore moves it
		if errors.Is(err, proto.ErrUnknownType) {
			err = errNoActivity
		}
		return notify.Activity{}, err
	}
	return notify.Activity{Count: m.Activity, OpenConns: m.OpenConns, HooksInFlight: m.HooksInFlight}, nil
}

func (b *engineBackend) alive(p proc) bool { return alive(p) }

func (b *engineBackend) exe(p proc) (string, int64, string, bool, error) { return procExe(p.PID) }

func (b *engineBackend) lastRestore() (engine.Timings, bool, bool) {
	return b.lastTimings, b.lastPrepared, true
}

func (b *engineBackend) listenFiles() []*os.File { return b.extra }

func (b *engineBackend) copies() []proc { return findCopies(b.dir, b.o.serviceUID()) }

func (b *engineBackend) ready(ctx context.Context, p proc) error {
	deadline := time.Now().Add(b.o.ReadyTimeout)
	for {
		if _, err := client.Find(p.PID); err == nil {
			return nil
		}
		if !alive(p) {
			return fmt.Errorf("PID %d exited", p.PID)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PID %d opened no control socket within %v", p.PID, b.o.ReadyTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *engineBackend) killCopy(p proc) {
	if alive(p) {
		killTree(p.PID)
	}
	if err := waitGone(func() bool { return alive(p) }, 10*time.Second); err != nil {
		b.log.Error("standby: killed the service, which does not exit", "pid", p.PID, "err", err)
	}
}

func alive(p proc) bool {
	st, err := procfs.ReadStat(p.PID)
	return err == nil && !st.Zombie() && st.StartTime == p.Start
}

// killTree kills a service that must not be left running (it never opened
// its control socket): it is init of its PID namespace, so SIGKILL to it
// ends the namespace.
func killTree(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}

// errNoActivity is returned for an app whose notify library predates the
// activity request.
var errNoActivity = errors.New("the service's kcr notify library does not report activity: rebuild it with this kcr's notify package")
