package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

// runOpts are run's arguments and flags.
type runOpts struct {
	cmdline
	o     engine.RunOptions
	ready time.Duration
	cred  credFlags
}

func runCmd(g *globals) *cobra.Command {
	var opts runOpts
	cmd := &cobra.Command{
		Use:   "run [flags] -- PROG [ARGS...]",
		Short: "Start a service so that it can be checkpointed and cloned; prints its PID",
		Long: `Start a service so that it can be checkpointed and cloned.

The service runs as init of a PID namespace of its own (no mount namespace),
as leader of its own session, with stdin from /dev/null and stdout and stderr
appended to a log, and no other descriptor: none that kcr inherited (CRIU
could not dump a file opened in another mount namespace).
GODEBUG=multipathtcp=0 is set unless GODEBUG already sets multipathtcp. kcr waits until the service's kcr control socket is up, prints
its host PID and exits; the service keeps running.

As init of its namespace, the service is the parent of every orphaned
process in it, and Go does not reap orphans: a service that starts
subprocesses which outlive their parent should reap them, or run with
--no-pid-namespace (and then cannot be cloned).

The service runs with no capability and with no_new_privs, whatever its uid,
unless --caps names the ones it keeps; --user runs it as another user.`,
		Args: cobra.MinimumNArgs(1),
		RunE: runE(g, &opts, runRun),
	}
	f := cmd.Flags()
	f.StringVar(&opts.o.Log, "log", "", "file for the service's output, opened with O_APPEND (default ./PROG.log)")
	f.BoolVar(&opts.o.NoPIDNamespace, "no-pid-namespace", false, "run in the host's PID namespace (no clones)")
	f.StringArrayVarP(&opts.o.Env, "env", "e", nil, "add KEY=VALUE to the environment")
	f.DurationVar(&opts.ready, "ready-timeout", 10*time.Second, "how long to wait for the service's control socket (0: do not wait)")
	opts.cred.add(cmd)
	return cmd
}

// runJSON is kcr run --json's one shape: the started service.
type runJSON struct {
	PID    int    `json:"pid"`
	Log    string `json:"log"`
	Socket string `json:"socket"`
}

// runRun runs kcr run: results on out's stdout, the report on its stderr.
func runRun(ctx context.Context, opts *runOpts, out *output) error {
	args := opts.args
	o, ready := &opts.o, opts.ready
	if err := nonNegative(map[string]time.Duration{"--ready-timeout": ready}); err != nil {
		return err
	}
	o.Args = args
	o.ReadyTimeout = ready
	var err error
	if o.Cred, o.Caps, o.AllCaps, err = opts.cred.resolve(); err != nil {
		return err
	}
	res, err := engine.Run(ctx, *o)
	if res != nil && errors.Is(err, engine.ErrNoSocketYet) {
		fmt.Fprintln(out.stderr, "kcr: warning: "+err.Error())
		err = nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out.stderr, "started %s as PID %d (log %s)\n", args[0], res.PID, res.Log)
	if out.json {
		return out.JSON(runJSON{PID: res.PID, Log: res.Log, Socket: res.Socket})
	}
	fmt.Fprintln(out.stdout, res.PID)
	return nil
}
