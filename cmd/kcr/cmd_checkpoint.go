package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/engine/container"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// checkpointOpts are checkpoint's arguments and flags.
type checkpointOpts struct {
	cmdline
	o        engine.CheckpointOptions // the flags only a process takes
	ctr      container.Target         // --container, --runtime, --runc-root
	signFile string
	// The flags both a process and a container take, mapped into the one
	// mode's options by runCheckpoint.
	output                          string
	leaveRunning, tcpClose, drained bool
}

func checkpointCmd(g *globals) *cobra.Command {
	var opts checkpointOpts
	cmd := &cobra.Command{
		Use:   "checkpoint PID | --container ID",
		Short: "Run the process's checkpoint hooks, dump it with CRIU and write an image",
		Long: `Run the process's checkpoint hooks, dump it with CRIU and write an image.

With --container ID, the runc container ID is checkpointed with "runc checkpoint" into
the image's criu/ directory, the manifest beside it; the app's hooks run in kcr's CRIU
action script (kcr install-runtime-hook), which runc's CRIU must be configured to run.
With --runtime podman (or a container only podman knows), "podman container checkpoint
--export" writes Podman's archive into the image instead; podman must run the container
with runc (podman --runtime runc run ...) for the hooks to run.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("container") {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: runE(g, &opts, runCheckpoint),
	}
	f := cmd.Flags()
	f.StringVarP(&opts.output, "output", "o", "", "image directory to create (default ./kcr-PID-TIME)")
	f.BoolVar(&opts.leaveRunning, "leave-running", false, "keep the process running after the dump")
	hookBudgetFlag(f, &opts.o.HookBudget, proto.DefaultHookBudget, "deadline for the app's before-checkpoint hooks")
	f.BoolVar(&opts.tcpClose, "tcp-close", false, "let CRIU close TCP connections that no hook closed (never for Kafka clients: an image with Kafka connections closed this way restores as one copy only)")
	f.IntSliceVar(&opts.o.KafkaPorts, "kafka-port", engine.DefaultKafkaPorts, "broker ports whose open connections kcr takes for a Kafka client's (repeat or comma-separate)")
	f.BoolVar(&opts.o.NoHooks, "no-hooks", false, "dump a process that has no kcr control socket")
	f.BoolVar(&opts.drained, "require-drained", false, "fail (exit 10, app resumed) if a resource would carry records into the image")
	f.BoolVar(&opts.o.ShellJob, "shell-job", false, "dump a process attached to a terminal (detected by default)")
	f.DurationVar(&opts.o.ResumeAfter, "resume-after", 0, "how long the app waits for kcr after its hooks before it resumes on its own (default hook-budget+60s)")
	signFlag(f, &opts.signFile)
	containerFlags(f, &opts.ctr)
	return cmd
}

// hookBudgetFlag binds --hook-budget, the one name of the before-checkpoint
// hooks' deadline (kcr standby's too), and --timeout, a deprecated alias
// that checkpoint and criu-hook still accept so that scripts keep working.
func hookBudgetFlag(f *pflag.FlagSet, d *time.Duration, def time.Duration, usage string) {
	f.DurationVar(d, "hook-budget", def, usage)
	f.DurationVar(d, "timeout", def, usage)
	_ = f.MarkDeprecated("timeout", "use --hook-budget")
}

// containerFlags are the flags that select a runc container.
func containerFlags(f *pflag.FlagSet, o *container.Target) {
	f.StringVar(&o.ID, "container", "", "a runc container's id, checkpointed or restored with runc")
	f.StringVar(&o.Runtime, "runtime", "runc", "with --container: the runc binary, or podman to go through podman container checkpoint/restore (a container runc does not know is looked for in podman)")
	f.StringVar(&o.RuncRoot, "runc-root", "", "with --container: runc's --root state directory")
}

// checkpointJSON is kcr checkpoint --json's one shape, also with --container
// (PID is then the container's init).
type checkpointJSON struct {
	Image       string           `json:"image"`
	PID         int              `json:"pid"`
	Phases      engine.Timings   `json:"phases"`
	Manifest    *images.Manifest `json:"manifest"`
	Warnings    []string         `json:"warnings"`
	ResumeError string           `json:"resume_error"`
	SignedBy    string           `json:"signed_by"`
}

// printCheckpoint prints a written image's phases and hooks, and who
// signed it if key is set.
func printCheckpoint(out *output, res *engine.CheckpointResult, what string, pid int, key ed25519.PrivateKey) error {
	m := res.Manifest
	fmt.Fprintf(out.stderr, "checkpointed %s (%s) to %s\n", what, m.Process.Comm, res.Image)
	phaseLines(out.stderr, res.Timings)
	for _, r := range m.Resources {
		fmt.Fprintf(out.stderr, "  hook %-15s %s%s\n", r.Name, fmtDur(r.Duration()), details(r.Details))
	}
	fmt.Fprintf(out.stderr, "  image size           %s (RSS %s)\n", fmtSize(m.TotalSize()), fmtSize(m.Process.RSSBytes))
	if n := m.CarriedRecords(); n > 0 {
		fmt.Fprintf(out.stderr, "kcr: warning: the image carries %d records (%s): every restored copy sends them, a deleted image loses them (--require-drained refuses such a checkpoint)\n",
			n, strings.Join(m.Carriers(), ", "))
	}
	signedBy := ""
	if key != nil {
		signedBy = images.Fingerprint(key.Public().(ed25519.PublicKey))
		fmt.Fprintf(out.stderr, "  signature            %s by %s\n", images.SignatureName, signedBy)
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(out.stderr, "kcr: warning: "+w)
	}
	if res.ResumeErr != nil {
		fmt.Fprintln(out.stderr, "kcr: warning: the image is complete, but the app's resume hooks: "+res.ResumeErr.Error())
	}
	if out.json {
		return out.JSON(checkpointJSON{Image: res.Image, PID: pid, Phases: res.Timings, Manifest: m,
			Warnings: nonNil(res.Warnings), ResumeError: errString(res.ResumeErr), SignedBy: signedBy})
	}
	return nil
}

// runCheckpoint runs kcr checkpoint: results on out's stdout, the report on its stderr.
func runCheckpoint(ctx context.Context, opts *checkpointOpts, out *output) error {
	g := &opts.globals
	args := opts.args
	o, ctr, signFile := &opts.o, &opts.ctr, opts.signFile
	// Before anything touches the target: a bad key is refused
	// while the app still runs untouched.
	key, err := loadSignKey(signFile)
	if err != nil {
		return err
	}
	if ctr.ID != "" {
		co := container.CheckpointOptions{Target: *ctr, Output: opts.output, LeaveRunning: opts.leaveRunning,
			TCPClose: opts.tcpClose, SignKey: key, RequireDrained: opts.drained}
		if co.Output == "" {
			co.Output = fmt.Sprintf("kcr-%s-%s", ctr.ID, time.Now().Format("20060102-150405"))
		}
		res, err := container.CheckpointContainer(ctx, co)
		if err != nil {
			return err
		}
		return printCheckpoint(out, res, "container "+ctr.ID, res.Manifest.Process.PID, key)
	}
	pid, err := strconv.Atoi(args[0])
	if err != nil || pid <= 0 {
		return &exitError{exitUsage, fmt.Errorf("%q is not a PID: give the numeric process id", args[0])}
	}
	o.PID = pid
	o.CRIU = g.criu
	o.Output, o.LeaveRunning, o.TCPClose, o.RequireDrained, o.SignKey = opts.output, opts.leaveRunning, opts.tcpClose, opts.drained, key
	if err := nonNegative(map[string]time.Duration{"--hook-budget": o.HookBudget, "--resume-after": o.ResumeAfter}); err != nil {
		return err
	}
	if g.verbose {
		o.CRIULogLevel = 4
	}
	if o.Output == "" {
		o.Output = fmt.Sprintf("kcr-%d-%s", pid, time.Now().Format("20060102-150405"))
	}
	o.AfterHooks, o.AfterDump = testStall("KCR_TEST_STALL_AFTER_HOOKS"), testStall("KCR_TEST_STALL_AFTER_DUMP")
	o.AtPostDump = testStall("KCR_TEST_STALL_AT_POST_DUMP")
	if o.NoHooks {
		fmt.Fprintln(out.stderr, "kcr: warning: --no-hooks: the process is dumped without running its hooks; open connections must be handled by CRIU (--tcp-close; unsafe for a Kafka client's connections)")
	}
	res, err := engine.Checkpoint(ctx, *o)
	if err != nil {
		return err
	}
	return printCheckpoint(out, res, fmt.Sprintf("PID %d", pid), pid, key)
}
