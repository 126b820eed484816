package runtimehook

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
	"time"

	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// FailedMarker is in the log line and the error of failed before-checkpoint
// hooks, for those who see only CRIU's log or the runtime's message.
const FailedMarker = "before-checkpoint hooks failed"

// HookError is returned when before-checkpoint hooks failed: nothing may be
// dumped, and every process was resumed.
type HookError struct {
	Failed []Target // the processes whose hooks failed, with their Error
}

// Error names each failed process and its error, after FailedMarker.
func (e *HookError) Error() string {
	var s []string
	for _, t := range e.Failed {
		s = append(s, fmt.Sprintf("PID %d: %s", t.PID, t.Error))
	}
	return FailedMarker + ", the dump must not go on, every app resumed: " + strings.Join(s, "; ")
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
		wg.Go(func() {
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
		})
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
