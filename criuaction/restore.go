package criuaction

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
)

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
		wg.Go(func() {
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
		})
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
	root, err := openStateDir(o.StateDir, true)
	if err != nil {
		o.Logger.Warn("post-restore: the restore count is not kept", "err", err)
		return nil
	}
	defer root.Close()
	writeStateFile(root, filepath.Base(generationFile(o, env.CRIUPID)), []byte(strconv.FormatUint(gen, 10)))
	return nil
}

// GenerationEnv, in the runtime's environment (which CRIU passes to its
// script), gives the restore's generation: "kcr restore --container" counts
// restores in the kcr image, as "kcr restore" does.
const GenerationEnv = "KCR_HOOK_GENERATION"

func generationFile(o Options, criuPID int) string {
	return filepath.Join(o.StateDir, "restore-"+strconv.Itoa(criuPID))
}

// takeGeneration returns the count postRestore kept for this CRIU, or
// counts now if it could not (a direct call with the images still there).
func takeGeneration(env Env, o Options) uint64 {
	if g, err := strconv.ParseUint(os.Getenv(GenerationEnv), 10, 64); err == nil {
		return g
	}
	if root, err := openStateDir(o.StateDir, false); err == nil {
		name := filepath.Base(generationFile(o, env.CRIUPID))
		b, err := readStateFile(root, name)
		if err == nil {
			root.Remove(name)
		}
		root.Close()
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
