package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/notify/proto"
)

// asCRIUHook makes the binary, run as kcr-criu-hook (the link CRIU runs as
// its action script, with no arguments), run "kcr criu-hook".
func asCRIUHook(args []string) []string {
	if len(args) > 0 && filepath.Base(args[0]) == criuaction.ScriptName {
		return append([]string{args[0], "criu-hook"}, args[1:]...)
	}
	return args
}

// criuHookOpts are criu-hook's arguments and flags.
type criuHookOpts struct {
	cmdline
	o criuaction.Options
	// stdin is the watch subcommand's pipe from pre-dump.
	stdin io.Reader
}

func criuHookCmd(g *globals) *cobra.Command {
	var opts criuHookOpts
	env := criuaction.OptionsFromEnv()
	cmd := &cobra.Command{
		Use:   "criu-hook",
		Short: "CRIU action script: run the kcr hooks of a tree that a container runtime checkpoints or restores",
		Long: `CRIU runs this (as the link ` + criuaction.DefaultHook + `, see kcr install-runtime-hook) at every
stage of a dump or restore. At pre-dump it runs the before-checkpoint hooks of every process of
the tree of $CRTOOLS_INIT_PID that has a kcr control socket and fails (so that CRIU aborts) if one
fails; at post-resume it sends the after-restore message. Defaults come from $KCR_HOOK_BUDGET,
$KCR_HOOK_RESUME_AFTER and $KCR_HOOK_AFTER_WAIT. It logs to stderr, which is CRIU's log.`,
		Args: cobra.NoArgs,
		RunE: runE(g, &opts, runCRIUHook),
	}
	f := cmd.Flags()
	o := &opts.o
	hookBudgetFlag(f, &o.HookBudget, cmp.Or(env.HookBudget, proto.DefaultHookBudget), "deadline for the apps' before-checkpoint hooks")
	f.DurationVar(&o.ResumeAfter, "resume-after", env.ResumeAfter, "how long an app waits for the end of the checkpoint before it resumes on its own (default hook-budget+60s)")
	f.BoolVar(&o.RequireDrained, "require-drained", env.RequireDrained, "veto the dump when a resource would carry records into the image (kcr checkpoint --container --require-drained sets $"+criuaction.EnvRequireDrained+")")
	f.DurationVar(&o.AfterWait, "after-wait", cmp.Or(env.AfterWait, 10*time.Second), "how long post-resume waits for the after-restore hooks")
	f.StringVar(&o.StateDir, "state-dir", env.StateDir, "directory of the resume watcher's state (default /run/kcr/criu-hook)")

	watch := &cobra.Command{
		Use:    "watch STATE",
		Short:  "resume the apps of a checkpoint once CRIU is done (started by pre-dump)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.stdin = cmd.InOrStdin()
			return runE(g, &opts, runCRIUHookWatch)(cmd, args)
		},
	}
	cmd.AddCommand(watch)
	return cmd
}

// hookOptions checks criu-hook's durations and sets its logger (stderr,
// which is CRIU's log) unless a test set one.
func (opts *criuHookOpts) hookOptions() (criuaction.Options, error) {
	o := opts.o
	if err := nonNegative(map[string]time.Duration{"--hook-budget": o.HookBudget, "--resume-after": o.ResumeAfter, "--after-wait": o.AfterWait}); err != nil {
		return o, err
	}
	if o.Logger == nil {
		o.Logger = criuaction.Logger(opts.verbose)
	}
	return o, nil
}

// runCRIUHook runs kcr criu-hook for the CRIU action its environment names:
// with --json the result on out's stdout; the log goes to CRIU's.
func runCRIUHook(ctx context.Context, opts *criuHookOpts, out *output) error {
	o, err := opts.hookOptions()
	if err != nil {
		return err
	}
	res, err := criuaction.RunFromEnv(ctx, o)
	if err != nil {
		return err
	}
	if out.json {
		return out.JSON(res)
	}
	return nil
}

// runCRIUHookWatch runs kcr criu-hook watch STATE (opts.args[0]), which
// pre-dump starts: it resumes the apps once CRIU is done.
func runCRIUHookWatch(ctx context.Context, opts *criuHookOpts, out *output) error {
	o, err := opts.hookOptions()
	if err != nil {
		return err
	}
	if len(opts.args) != 1 || opts.args[0] == "" {
		return &exitError{exitUsage, errors.New("criu-hook watch: give the state file that pre-dump wrote")}
	}
	if err := criuaction.Watch(ctx, opts.args[0], opts.stdin, o); err != nil {
		o.Logger.Warn("watch", "err", err)
		return err // a missing state file: exit 2, as any missing input
	}
	return nil
}

// installHookOpts are install-runtime-hook's arguments and flags.
type installHookOpts struct {
	cmdline
	o      criuaction.InstallOptions
	remove bool
}

func installHookCmd(g *globals) *cobra.Command {
	var opts installHookOpts
	cmd := &cobra.Command{
		Use:   "install-runtime-hook",
		Short: "Make CRIU run kcr's hooks when runc (Podman, CRI-O, the kubelet) checkpoints a container",
		Long: `Links the action script (--hook) to this kcr binary and adds kcr's block to the CRIU
configuration file that runc reads (--config; a container's org.criu.config annotation names
another one), keeping the rest of the file. Idempotent; --remove undoes it.`,
		Args: cobra.NoArgs,
		RunE: runE(g, &opts, runInstallHook),
	}
	f := cmd.Flags()
	f.StringVar(&opts.o.Config, "config", criuaction.DefaultConfig, "CRIU configuration file to change")
	f.StringVar(&opts.o.Hook, "hook", criuaction.DefaultHook, "path of the action script (a link to kcr)")
	f.BoolVar(&opts.o.TCPClose, "tcp-close", false, "also let CRIU close TCP connections that no hook closed")
	f.BoolVar(&opts.remove, "remove", false, "take kcr's block out of the configuration and remove the link")
	return cmd
}

// runInstallHook runs kcr install-runtime-hook: with --json the result on
// out's stdout, the report on its stderr.
func runInstallHook(ctx context.Context, opts *installHookOpts, out *output) error {
	var res *criuaction.InstallResult
	var err error
	if opts.remove {
		res, err = criuaction.Remove(opts.o)
	} else {
		res, err = criuaction.Install(opts.o)
	}
	if err != nil {
		return err
	}
	if out.json {
		return out.JSON(res)
	}
	what := map[bool]string{false: "unchanged", true: "updated"}
	if opts.remove {
		fmt.Fprintf(out.stderr, "removed kcr's CRIU hook: %s %s, %s %s\n", res.Config, what[res.ConfigChanged], res.Hook, what[res.HookChanged])
		return nil
	}
	fmt.Fprintf(out.stderr, "CRIU runs kcr's hooks: %s %s; %s -> %s %s\n", res.Config, what[res.ConfigChanged], res.Hook, res.Target, what[res.HookChanged])
	return nil
}
