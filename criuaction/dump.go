package criuaction

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// Failure returns the error of the failed targets (those with an Error):
// their reports, and a message naming each PID and its error; nil if none
// failed. kcr checkpoint --container reads it back from ReportsFile.
func Failure(targets []Target) *proto.HookFailure {
	he := &proto.HookFailure{}
	var msgs []string
	for _, t := range targets {
		if t.Error == "" {
			continue
		}
		msgs = append(msgs, fmt.Sprintf("PID %d: %s", t.PID, t.Error))
		he.Reports = append(he.Reports, t.Reports...)
	}
	if len(msgs) == 0 {
		return nil
	}
	he.Msg = strings.Join(msgs, "; ")
	return he
}

func preDump(ctx context.Context, env Env, o Options, res *Result) (rerr error) {
	log := o.Logger
	ts, err := targets(env, o, res)
	if err != nil || len(ts) == 0 {
		return err
	}
	// containerd froze the tree (freezer.go): thaw it for the hooks, and
	// freeze it again before CRIU goes on, whatever the hooks did.
	refreeze, err := thawForHooks("/proc", env.InitPID, 5*time.Second)
	if err != nil {
		return fmt.Errorf("pre-dump: the tree's cgroup is frozen: %w", err)
	}
	if refreeze != nil {
		log.Info("pre-dump: the container was paused (containerd pauses before a checkpoint): thawed for the hooks", "init_pid", env.InitPID)
		defer func() {
			if ferr := refreeze(); ferr != nil {
				log.Warn("pre-dump: "+ferr.Error(), "init_pid", env.InitPID)
				if rerr == nil {
					rerr = ferr
				}
			}
		}()
	}
	// The watcher starts while the hooks run: it waits for the outcome.
	watcher := make(chan spawned, 1)
	go func() {
		c, err := o.SpawnWatcher(stateFile(o, env.CRIUPID))
		watcher <- spawned{c, err}
	}()
	ready := checkpointTargets(ctx, env, o, ts)
	res.Targets = ts
	return settlePreDump(env, o, res, ts, ready, <-watcher)
}

// spawned is the resume watcher as SpawnWatcher started it: commit tells it
// whether the dump goes on.
type spawned struct {
	commit func(bool)
	err    error
}

// checkpointTargets asks every target to run its before-checkpoint hooks,
// all at once, so the pause is the slowest app's, not the sum; ready[i] is
// whether ts[i] is ready for the dump, and a failed target gets its Error
// and its hooks' reports.
func checkpointTargets(ctx context.Context, env Env, o Options, ts []Target) (ready []bool) {
	hctx, cancel := context.WithTimeout(ctx, o.HookBudget+5*time.Second)
	defer cancel()
	ready = make([]bool, len(ts))
	var wg sync.WaitGroup
	for i := range ts {
		wg.Go(func() {
			t := time.Now()
			m, err := ts[i].sock().Checkpoint(hctx, client.CheckpointRequest{HookBudget: o.HookBudget, ResumeAfter: o.ResumeAfter, LeaveRunning: env.LeaveRunning, RequireDrained: o.RequireDrained})
			ts[i].Reports = m.Reports
			if err != nil {
				ts[i].Error = err.Error()
				var hf *proto.HookFailure
				if errors.As(err, &hf) {
					ts[i].Reports = hf.Reports
					if hf.Msg != "" { // else err's text: a failed target has an Error
						ts[i].Error = hf.Msg
					}
				}
				o.Logger.Warn("pre-dump: "+string(proto.FailedMarker), "pid", ts[i].PID, "err", ts[i].Error)
				return
			}
			ready[i] = true
			o.Logger.Info("pre-dump: before-checkpoint hooks done", "pid", ts[i].PID, "socket", ts[i].Socket, "took", time.Since(t).Round(time.Microsecond), "hooks", len(m.Reports), "leave_running", env.LeaveRunning)
		})
	}
	wg.Wait()
	return ready
}

// settlePreDump ends the pre-dump once the hooks are done: with every
// target ready and the watcher started, it writes the reports and the
// watcher's state and lets the dump go on; otherwise it resumes every
// target and returns the failure.
func settlePreDump(env Env, o Options, res *Result, ts []Target, ready []bool, w spawned) error {
	var failed []Target
	for i, t := range ts {
		if !ready[i] {
			failed = append(failed, t)
		}
	}
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
	he := Failure(failed)
	resumeAll(ts, ready, "checkpoint aborted: "+he.Error(), o)
	return he
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
		// Not through a link: the images directory is CRIU's caller's.
		var f *os.File
		f, err = os.OpenFile(filepath.Join(env.ImageDir, ReportsFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
		if err == nil {
			if fi, serr := f.Stat(); serr != nil || !fi.Mode().IsRegular() {
				err = errors.Join(serr, errors.New(ReportsFile+": not a regular file"))
			} else {
				_, err = f.Write(b)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
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
		wg.Go(func() {
			_, err := t.sock().Resume(ctx, reason, o.AfterWait)
			o.Logger.Log(ctx, level(err), "resumed", "pid", t.PID, "reason", reason, "err", err)
		})
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

// ReportsFile is what pre-dump writes beside CRIU's images: the hooks'
// reports, for the manifest of "kcr checkpoint --container".
const ReportsFile = "kcr-hooks.json"
