package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/engine/container"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// restoreOpts are restore's arguments and flags.
type restoreOpts struct {
	cmdline
	o        engine.RestoreOptions    // the flags only a process image takes
	ctr      container.RestoreOptions // the flags only a container takes
	keyFiles []string
	// The flags both take, mapped into the one mode's options by runRestore.
	allowDuplicates, allowUntrusted bool
}

func restoreCmd(g *globals) *cobra.Command {
	var opts restoreOpts
	cmd := &cobra.Command{
		Use:   "restore IMAGE | --container ID IMAGE|ARCHIVE.tar|OCI-LAYOUT",
		Short: "Verify an image, restore it with CRIU and run the after-restore hooks; prints the new PID",
		Long: `Verify an image, restore it with CRIU and run the after-restore hooks.

With --container ID, a kcr image of a container (kcr checkpoint --container),
a checkpoint archive written by "kcr export --format cri-o", or the OCI image
layout of "kcr export --format oci", is restored with "runc restore" (or
podman, for an image of a Podman container) as the container ID. An archive is unpacked and verified as
"kcr import" does, into a private directory under $TMPDIR; runc restores into a
bundle built there from the checkpointed spec (the rootfs must be on this host
where it was), or into --bundle. The unpacked image is removed afterwards; the
built bundle stays for runc until you remove it with the container.

With --count N, N clones are restored at once, each with its own restore
generation and instance id (so its own Kafka client ids); this needs an
image of a service started with "kcr run". One line per clone is printed:
host PID, name and restore time.`,
		Args: cobra.ExactArgs(1),
		RunE: runE(g, &opts, runRestore),
	}
	f := cmd.Flags()
	f.DurationVar(&opts.o.HookWait, "wait", 30*time.Second, "how long to wait for the app's after-restore hooks")
	f.DurationVar(&opts.o.PIDWait, "pid-wait", 5*time.Second, "how long to wait for a zombie holding the image's PID")
	f.DurationVar(&opts.o.CRIUWait, "criu-wait", 2*time.Minute, "how long CRIU's restore may take: one still running then is stopped, with the tasks it restored so far (0: no limit)")
	f.IntVar(&opts.o.Count, "count", 1, "restore this many clones at once (images of services started with kcr run)")
	f.StringVar(&opts.o.Name, "name", "", "name of the restored instance (clones are NAME-1 … NAME-N)")
	f.BoolVar(&opts.o.Lazy, "lazy", false, "restore memory on demand through CRIU's lazy-pages daemon")
	f.BoolVar(&opts.o.Rehash, "rehash", false, "hash every file, also those unchanged on disk since they were last verified")
	f.BoolVar(&opts.allowDuplicates, "allow-duplicates", false, "restore an image that carries records, or had records in the application's hands, although they are sent or processed again (--count > 1, or a --leave-running image)")
	f.BoolVar(&opts.allowUntrusted, "allow-untrusted", false, "as root, restore an image that another user owns or could have written (it runs with root's powers; a signature does not replace this)")
	verifyKeyFlag(f, &opts.keyFiles)
	containerFlags(f, &opts.ctr.Target)
	f.StringVar(&opts.ctr.Bundle, "bundle", "", "with --container: the bundle to restore into (default: the one checkpointed)")
	opts.ctr.MaxSize = images.DefaultMaxImportSize
	f.Int64Var(&opts.ctr.MaxSize, "max-size", opts.ctr.MaxSize, "with --container and an archive: largest image, in bytes, to unpack (the free space is checked too)")
	f.StringVar(&opts.ctr.Stdout, "container-output", "", "with --container: file (appended to, created 0600) for the restored container's stdout and stderr (default /dev/null)")
	return cmd
}

// restoreJSON is kcr restore --json's one shape, whatever --count or
// --container: one entry in Restores per restored process.
type restoreJSON struct {
	Image     string         `json:"image"`
	Container string         `json:"container"`
	Bundle    string         `json:"bundle"`
	Restores  []restoredJSON `json:"restores"`
}

// restoredJSON is one restored process (a clone, or the container's init).
type restoredJSON struct {
	PID          int                `json:"pid"`
	Name         string             `json:"name"`
	Generation   uint64             `json:"generation"`
	InstanceID   string             `json:"instance_id"`
	Phases       engine.Timings     `json:"phases"`
	HooksPending bool               `json:"hooks_pending"`
	HookError    string             `json:"hook_error"`
	Reports      []proto.HookReport `json:"reports"`
	Log          string             `json:"log"`
	LazyPagesPID int                `json:"lazy_pages_pid"`
	LazyPagesLog string             `json:"lazy_pages_log"`
	CRIUStats    *criu.RestoreStats `json:"criu_stats"`
}

// runRestore runs kcr restore: results on out's stdout, the report on its stderr.
func runRestore(ctx context.Context, opts *restoreOpts, out *output) error {
	keys, err := loadVerifyKeys(opts.keyFiles)
	if err != nil {
		return err
	}
	if ctr := &opts.ctr; ctr.ID != "" || ctr.Bundle != "" {
		return restoreContainer(ctx, opts, keys, out)
	}
	o := &opts.o
	o.Image, o.VerifyKeys, o.AllowUntrusted, o.AllowDuplicates = opts.args[0], keys, opts.allowUntrusted, opts.allowDuplicates
	o.CRIU = opts.globals.criu
	if err := nonNegative(map[string]time.Duration{"--wait": o.HookWait, "--pid-wait": o.PIDWait, "--criu-wait": o.CRIUWait}); err != nil {
		return err
	}
	if o.Count < 1 {
		return &exitError{exitUsage, fmt.Errorf("--count %d is negative or zero: give the number of clones, 1 or more", o.Count)}
	}
	o.AfterVerify = testStall("KCR_TEST_STALL_AFTER_VERIFY")
	o.Logger = slog.Default() // set up by the root command (-v: debug)
	if opts.globals.verbose {
		o.CRIULogLevel = 4
	}
	clones, err := engine.RestoreClones(ctx, *o)
	if err != nil && len(clones) == 0 {
		return err
	}
	var hookErr error
	doc := restoreJSON{Image: o.Image, Restores: []restoredJSON{}}
	for _, res := range clones {
		reportRestored(out, o, res)
		if res.HookErr != nil && hookErr == nil {
			hookErr = fmt.Errorf("restored as PID %d, but %w", res.PID, res.HookErr)
		}
		doc.Restores = append(doc.Restores, restoredJSON{PID: res.PID, Name: res.Name, Generation: res.Generation,
			InstanceID: res.InstanceID, Phases: res.Timings, HooksPending: res.HooksPending,
			HookError: errString(res.HookErr), Reports: res.Reports, Log: res.LogPath,
			LazyPagesPID: res.LazyPID, LazyPagesLog: res.LazyLog, CRIUStats: res.CRIUStats})
	}
	if out.json {
		if err := out.JSON(doc); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	return afterHooksErr(hookErr)
}

// restoreContainer runs kcr restore --container or --bundle: the image
// restored as a container of the runtime.
func restoreContainer(ctx context.Context, opts *restoreOpts, keys []ed25519.PublicKey, out *output) error {
	ctr := &opts.ctr
	ctr.Image, ctr.VerifyKeys, ctr.AllowUntrusted, ctr.AllowDuplicates = opts.args[0], keys, opts.allowUntrusted, opts.allowDuplicates
	if ctr.MaxSize <= 0 {
		return &exitError{exitUsage, fmt.Errorf("--max-size %d: give a positive number of bytes", ctr.MaxSize)}
	}
	res, err := container.RestoreContainer(ctx, *ctr)
	if err != nil {
		return err
	}
	fmt.Fprintf(out.stderr, "restored %s as container %s, init PID %d (generation %d, bundle %s)\n", ctr.Image, res.ID, res.PID, res.Generation, res.Bundle)
	phaseLines(out.stderr, res.Timings)
	if out.json {
		return out.JSON(restoreJSON{Image: ctr.Image, Container: res.ID, Bundle: res.Bundle,
			Restores: []restoredJSON{{PID: res.PID, Generation: res.Generation, Phases: res.Timings}}})
	}
	fmt.Fprintln(out.stdout, res.PID)
	return nil
}

// reportRestored tells of one restored copy: on stderr how it went, on
// stdout (unless --json) its PID, with its name and time for clones.
func reportRestored(out *output, o *engine.RestoreOptions, res *engine.RestoreResult) {
	if o.Count > 1 {
		fmt.Fprintf(out.stderr, "restored %s as PID %d (generation %d) in %s\n", res.Name, res.PID, res.Generation, fmtDur(res.Timings.Get(engine.PhaseRestore)))
	} else {
		fmt.Fprintf(out.stderr, "restored %s as PID %d (generation %d)\n", o.Image, res.PID, res.Generation)
		phaseLines(out.stderr, res.Timings)
		if st := res.CRIUStats; st != nil {
			fmt.Fprintf(out.stderr, "  criu: restore %s (forking %s), pages restored %d\n", fmtDur(st.RestoreTime), fmtDur(st.ForkingTime), st.PagesRestored)
		}
	}
	if res.LazyPID != 0 {
		fmt.Fprintf(out.stderr, "lazy-pages daemon PID %d serves the remaining memory and exits when done (log %s); keep the image until then\n", res.LazyPID, res.LazyLog)
	}
	if res.HooksPending {
		fmt.Fprintf(out.stderr, "kcr: warning: PID %d: after-restore hooks still pending after %v; the app goes on with them (see its log)\n", res.PID, o.HookWait)
	}
	if out.json {
		return
	}
	if o.Count > 1 {
		fmt.Fprintf(out.stdout, "%d\t%s\t%s\n", res.PID, res.Name, fmtDur(res.Timings.Get(engine.PhaseRestore)))
	} else {
		fmt.Fprintln(out.stdout, res.PID)
	}
}

// afterHooksErr is the error of a restore whose process runs but whose
// after-restore hooks failed (exit 8), or were cut short by an interrupt
// of kcr (exit 130: the app goes on with them by itself).
func afterHooksErr(hookErr error) error {
	if hookErr == nil || errors.Is(hookErr, context.Canceled) {
		return hookErr
	}
	return &exitError{exitAfterHooks, hookErr}
}
