package main

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
)

// phaseLines prints one line per phase on stderr.
func phaseLines(t engine.Timings) {
	for _, p := range t {
		fmt.Fprintf(stderr, "  %-20s %s\n", p.Name, fmtDur(p.Duration()))
	}
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

func fmtSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func checkpointCmd(g *globals) *cobra.Command {
	var o engine.CheckpointOptions
	var ctr engine.ContainerOptions
	var signFile string
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
		RunE: func(cmd *cobra.Command, args []string) error {
			// Before anything touches the target: a bad key is refused
			// while the app still runs untouched.
			key, err := loadSignKey(signFile)
			if err != nil {
				return err
			}
			o.SignKey, ctr.SignKey = key, key
			if ctr.ID != "" {
				ctr.Output, ctr.LeaveRunning, ctr.TCPClose, ctr.RequireDrained = o.Output, o.LeaveRunning, o.TCPClose, o.RequireDrained
				if ctr.Output == "" {
					ctr.Output = fmt.Sprintf("kcr-%s-%s", ctr.ID, time.Now().Format("20060102-150405"))
				}
				res, err := engine.CheckpointContainer(cmd.Context(), ctr)
				if err != nil {
					return err
				}
				return printCheckpoint(g, res, "container "+ctr.ID, res.Manifest.Process.PID, key)
			}
			pid, err := strconv.Atoi(args[0])
			if err != nil || pid <= 0 {
				return &exitError{exitUsage, fmt.Errorf("%q is not a PID: give the numeric process id", args[0])}
			}
			o.PID = pid
			o.CRIU = g.criu
			if err := nonNegative(map[string]time.Duration{"--timeout": o.HookBudget, "--resume-after": o.ResumeAfter}); err != nil {
				return err
			}
			if g.verbose {
				o.CRIULogLevel = 4
			}
			if o.Output == "" {
				o.Output = fmt.Sprintf("kcr-%d-%s", pid, time.Now().Format("20060102-150405"))
			}
			if d, err := time.ParseDuration(os.Getenv("KCR_TEST_STALL_AFTER_HOOKS")); err == nil {
				// For the e2e test that kills kcr between hooks and dump.
				o.AfterHooks = func() { time.Sleep(d) }
			}
			if d, err := time.ParseDuration(os.Getenv("KCR_TEST_STALL_AFTER_DUMP")); err == nil {
				// For the e2e test that kills kcr between dump and publish.
				o.AfterDump = func() { time.Sleep(d) }
			}
			if o.NoHooks {
				fmt.Fprintln(stderr, "kcr: warning: --no-hooks: the process is dumped without running its hooks; open connections must be handled by CRIU (--tcp-close)")
			}
			res, err := engine.Checkpoint(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printCheckpoint(g, res, fmt.Sprintf("PID %d", pid), pid, key)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Output, "output", "o", "", "image directory to create (default ./kcr-PID-TIME)")
	f.BoolVar(&o.LeaveRunning, "leave-running", false, "keep the process running after the dump")
	f.DurationVar(&o.HookBudget, "timeout", 10*time.Second, "deadline for the app's before-checkpoint hooks")
	f.BoolVar(&o.TCPClose, "tcp-close", false, "let CRIU close TCP connections that no hook closed")
	f.BoolVar(&o.NoHooks, "no-hooks", false, "dump a process that has no kcr control socket")
	f.BoolVar(&o.RequireDrained, "require-drained", false, "fail (exit 10, app resumed) if a resource would carry records into the image")
	f.BoolVar(&o.ShellJob, "shell-job", false, "dump a process attached to a terminal (detected by default)")
	f.DurationVar(&o.ResumeAfter, "resume-after", 0, "how long the app waits for kcr after its hooks before it resumes on its own (default timeout+60s)")
	signFlag(f, &signFile)
	containerFlags(f, &ctr)
	return cmd
}

// containerFlags are the flags that select a runc container.
func containerFlags(f *pflag.FlagSet, o *engine.ContainerOptions) {
	f.StringVar(&o.ID, "container", "", "a runc container's id, checkpointed or restored with runc")
	f.StringVar(&o.Runtime, "runtime", "runc", "with --container: the runc binary, or podman to go through podman container checkpoint/restore (a container runc does not know is looked for in podman)")
	f.StringVar(&o.RuncRoot, "runc-root", "", "with --container: runc's --root state directory")
}

// printCheckpoint prints a written image's phases and hooks, and who
// signed it if key is set.
func printCheckpoint(g *globals, res *engine.CheckpointResult, what string, pid int, key ed25519.PrivateKey) error {
	m := res.Manifest
	fmt.Fprintf(stderr, "checkpointed %s (%s) to %s\n", what, m.Process.Comm, res.Image)
	phaseLines(res.Timings)
	for _, r := range m.Resources {
		fmt.Fprintf(stderr, "  hook %-15s %s%s\n", r.Name, fmtDur(r.Duration()), details(r.Details))
	}
	fmt.Fprintf(stderr, "  image size           %s (RSS %s)\n", fmtSize(m.TotalSize()), fmtSize(m.Process.RSSBytes))
	if n := m.CarriedRecords(); n > 0 {
		fmt.Fprintf(stderr, "kcr: warning: the image carries %d records (%s): every restored copy sends them, a deleted image loses them (--require-drained refuses such a checkpoint)\n",
			n, strings.Join(m.Carriers(), ", "))
	}
	signedBy := ""
	if key != nil {
		signedBy = images.Fingerprint(key.Public().(ed25519.PublicKey))
		fmt.Fprintf(stderr, "  signature            %s by %s\n", images.SignatureName, signedBy)
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, "kcr: warning: "+w)
	}
	if res.ResumeErr != nil {
		fmt.Fprintln(stderr, "kcr: warning: the image is complete, but the app's resume hooks: "+res.ResumeErr.Error())
	}
	if g.json {
		return printJSON(map[string]any{"image": res.Image, "pid": pid, "phases": res.Timings, "manifest": m,
			"warnings": res.Warnings, "resume_error": errString(res.ResumeErr), "signed_by": signedBy})
	}
	return nil
}

// nonNegative refuses negative durations, which would otherwise silently
// mean the default.
func nonNegative(flags map[string]time.Duration) error {
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if d := flags[name]; d < 0 {
			return &exitError{exitUsage, fmt.Errorf("%s %v is negative: give a positive duration such as 30s", name, d)}
		}
	}
	return nil
}

func details(d map[string]any) string {
	if len(d) == 0 {
		return ""
	}
	b, _ := json.Marshal(d)
	return " " + string(b)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func restoreCmd(g *globals) *cobra.Command {
	var o engine.RestoreOptions
	var ctr engine.ContainerOptions
	var keyFiles []string
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
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := loadVerifyKeys(keyFiles)
			if err != nil {
				return err
			}
			o.VerifyKeys, ctr.VerifyKeys = keys, keys
			ctr.AllowUntrusted = o.AllowUntrusted
			if ctr.ID != "" || ctr.Bundle != "" {
				ctr.Image = args[0]
				ctr.AllowDuplicates = o.AllowDuplicates
				if ctr.MaxSize <= 0 {
					return &exitError{exitUsage, fmt.Errorf("--max-size %d: give a positive number of bytes", ctr.MaxSize)}
				}
				res, err := engine.RestoreContainer(cmd.Context(), ctr)
				if err != nil {
					return err
				}
				fmt.Fprintf(stderr, "restored %s as container %s, init PID %d (generation %d, bundle %s)\n", ctr.Image, res.ID, res.PID, res.Generation, res.Bundle)
				phaseLines(res.Timings)
				if g.json {
					return printJSON(map[string]any{"container": res.ID, "pid": res.PID, "generation": res.Generation, "phases": res.Timings, "bundle": res.Bundle})
				}
				fmt.Println(res.PID)
				return nil
			}
			o.Image = args[0]
			o.CRIU = g.criu
			if err := nonNegative(map[string]time.Duration{"--wait": o.HookWait, "--pid-wait": o.PIDWait}); err != nil {
				return err
			}
			if o.Count < 1 {
				return &exitError{exitUsage, fmt.Errorf("--count %d is negative or zero: give the number of clones, 1 or more", o.Count)}
			}
			if d, err := time.ParseDuration(os.Getenv("KCR_TEST_STALL_AFTER_VERIFY")); err == nil {
				// For the e2e test that swaps the image after verification.
				o.AfterVerify = func() { time.Sleep(d) }
			}
			if g.verbose {
				o.CRIULogLevel = 4
			}
			clones, err := engine.RestoreClones(cmd.Context(), o)
			if err != nil && len(clones) == 0 {
				return err
			}
			var hookErr error
			var out []map[string]any
			for _, res := range clones {
				if o.Count > 1 {
					fmt.Fprintf(stderr, "restored %s as PID %d (generation %d) in %s\n", res.Name, res.PID, res.Generation, fmtDur(res.Timings.Get(engine.PhaseRestore)))
				} else {
					fmt.Fprintf(stderr, "restored %s as PID %d (generation %d)\n", o.Image, res.PID, res.Generation)
					phaseLines(res.Timings)
					if st := res.CRIUStats; st != nil {
						fmt.Fprintf(stderr, "  criu: restore %s (forking %s), pages restored %d\n", fmtDur(st.RestoreTime), fmtDur(st.ForkingTime), st.PagesRestored)
					}
				}
				if res.LazyPID != 0 {
					fmt.Fprintf(stderr, "lazy-pages daemon PID %d serves the remaining memory and exits when done (log %s); keep the image until then\n", res.LazyPID, res.LazyLog)
				}
				if res.HooksPending {
					fmt.Fprintf(stderr, "kcr: warning: PID %d: after-restore hooks still pending after %v; the app goes on with them (see its log)\n", res.PID, o.HookWait)
				}
				if res.HookErr != nil && hookErr == nil {
					hookErr = fmt.Errorf("restored as PID %d, but %w", res.PID, res.HookErr)
				}
				out = append(out, map[string]any{"pid": res.PID, "name": res.Name, "generation": res.Generation,
					"instance_id": res.InstanceID, "phases": res.Timings, "hooks_pending": res.HooksPending,
					"hook_error": errString(res.HookErr), "reports": res.Reports, "log": res.LogPath,
					"lazy_pages_pid": res.LazyPID, "lazy_pages_log": res.LazyLog, "criu_stats": res.CRIUStats})
				if !g.json {
					if o.Count > 1 {
						fmt.Printf("%d\t%s\t%s\n", res.PID, res.Name, fmtDur(res.Timings.Get(engine.PhaseRestore)))
					} else {
						fmt.Println(res.PID)
					}
				}
			}
			if g.json {
				var v any = out
				if o.Count <= 1 {
					v = out[0]
				}
				if err := printJSON(v); err != nil {
					return err
				}
			}
			if err != nil {
				return err
			}
			if hookErr != nil {
				return &exitError{exitAfterHooks, hookErr}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.HookWait, "wait", 30*time.Second, "how long to wait for the app's after-restore hooks")
	f.DurationVar(&o.PIDWait, "pid-wait", 5*time.Second, "how long to wait for a zombie holding the image's PID")
	f.IntVar(&o.Count, "count", 1, "restore this many clones at once (images of services started with kcr run)")
	f.StringVar(&o.Name, "name", "", "name of the restored instance (clones are NAME-1 … NAME-N)")
	f.BoolVar(&o.Lazy, "lazy", false, "restore memory on demand through CRIU's lazy-pages daemon")
	f.BoolVar(&o.Rehash, "rehash", false, "hash every file, also those unchanged on disk since they were last verified")
	f.BoolVar(&o.AllowDuplicates, "allow-duplicates", false, "restore an image that carries records although they are sent again (--count > 1, or a --leave-running image)")
	f.BoolVar(&o.AllowUntrusted, "allow-untrusted", false, "as root, restore an image that another user owns or could have written (it runs with root's powers; a signature does not replace this)")
	verifyKeyFlag(f, &keyFiles)
	containerFlags(f, &ctr)
	f.StringVar(&ctr.Bundle, "bundle", "", "with --container: the bundle to restore into (default: the one checkpointed)")
	ctr.MaxSize = images.DefaultMaxImportSize
	f.Int64Var(&ctr.MaxSize, "max-size", ctr.MaxSize, "with --container and an archive: largest image, in bytes, to unpack (the free space is checked too)")
	f.StringVar(&ctr.Stdout, "container-output", "", "with --container: file (truncated) for the restored container's stdout and stderr (default /dev/null)")
	return cmd
}

func runCmd(g *globals) *cobra.Command {
	var o engine.RunOptions
	var ready time.Duration
	cmd := &cobra.Command{
		Use:   "run [flags] -- PROG [ARGS...]",
		Short: "Start a service so that it can be checkpointed and cloned; prints its PID",
		Long: `Start a service so that it can be checkpointed and cloned.

The service runs as init of a PID namespace of its own (no mount namespace),
as leader of its own session, with stdin from /dev/null and stdout and stderr
appended to a log. GODEBUG=multipathtcp=0 is set unless GODEBUG already sets
multipathtcp. kcr waits until the service's kcr control socket is up, prints
its host PID and exits; the service keeps running.

As init of its namespace, the service is the parent of every orphaned
process in it, and Go does not reap orphans: a service that starts
subprocesses which outlive their parent should reap them, or run with
--no-pid-namespace (and then cannot be cloned).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := nonNegative(map[string]time.Duration{"--ready-timeout": ready}); err != nil {
				return err
			}
			o.Args = args
			o.ReadyTimeout = ready
			res, err := engine.Run(cmd.Context(), o)
			if res != nil && errors.Is(err, engine.ErrNoSocketYet) {
				fmt.Fprintln(stderr, "kcr: warning: "+err.Error())
				err = nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "started %s as PID %d (log %s)\n", args[0], res.PID, res.Log)
			if g.json {
				return printJSON(map[string]any{"pid": res.PID, "log": res.Log, "socket": res.Socket})
			}
			fmt.Println(res.PID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Log, "log", "", "file for the service's output, opened with O_APPEND (default ./PROG.log)")
	f.BoolVar(&o.NoPIDNamespace, "no-pid-namespace", false, "run in the host's PID namespace (no clones)")
	f.StringArrayVarP(&o.Env, "env", "e", nil, "add KEY=VALUE to the environment")
	f.DurationVar(&ready, "ready-timeout", 10*time.Second, "how long to wait for the service's control socket (0: do not wait)")
	return cmd
}

func recoverCmd(g *globals) *cobra.Command {
	var signFile string
	cmd := &cobra.Command{
		Use:   "recover DIR",
		Short: "Finish images whose kcr checkpoint died after the dump (DIR: the hidden .NAME.kcr-tmp-* directory, or the directory holding them)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := loadSignKey(signFile)
			if err != nil {
				return err
			}
			dirs := []string{args[0]}
			if !strings.Contains(filepath.Base(filepath.Clean(args[0])), ".kcr-tmp-") {
				if dirs = images.FindPending(args[0]); len(dirs) == 0 {
					return fmt.Errorf("%s: %w: no interrupted checkpoint with a finished dump in it", args[0], images.ErrNotRecoverable)
				}
			}
			var out []string
			for _, d := range dirs {
				img, err := images.Recover(cmd.Context(), d, key)
				if err != nil {
					return err
				}
				fmt.Fprintf(stderr, "kcr: recovered %s\n", img.Dir)
				out = append(out, img.Dir)
			}
			if g.json {
				return printJSON(map[string]any{"images": out})
			}
			return nil
		},
	}
	signFlag(cmd.Flags(), &signFile)
	return cmd
}

func inspectCmd(g *globals) *cobra.Command {
	var noVerify, rehash bool
	var keyFiles []string
	cmd := &cobra.Command{
		Use:   "inspect IMAGE",
		Short: "Show an image's manifest, sizes and timings",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := loadVerifyKeys(keyFiles)
			if err != nil {
				return err
			}
			if noVerify && keys != nil {
				return &exitError{exitUsage, errors.New("--no-verify skips the checks that --verify-key asks for: drop one of them")}
			}
			var m *images.Manifest
			var warn []string
			var signer ed25519.PublicKey
			cached := 0
			if noVerify {
				if m, err = images.ReadManifest(args[0]); err != nil {
					return err
				}
			} else {
				img, err := images.OpenWith(cmd.Context(), args[0], images.OpenOptions{Rehash: rehash, VerifyKeys: keys})
				if err != nil {
					return err
				}
				img.Close()
				m, warn = img.Manifest, img.Warnings
				cached, signer = img.Cached, img.Signer
			}
			if g.json {
				return printJSON(m)
			}
			w := safeWriter{os.Stdout}
			verified := "not verified"
			if !noVerify {
				verified = fmt.Sprintf("verified: %d files hashed, %d unchanged since their last check", len(m.Files)-cached, cached)
			}
			fmt.Fprintf(w, "image         %s (format %s v%d, %s)\n", args[0], m.Format, m.FormatVersion, verified)
			fmt.Fprintf(w, "created       %s on %s (kernel %s, CRIU %s, kcr %s)\n", m.Created.Format(time.RFC3339), m.Host, m.Kernel, m.CRIUVersion, m.KCRVersion)
			fmt.Fprintf(w, "process       PID %d %s (uid %d), cwd %s\n", m.Process.PID, m.Process.Comm, m.Process.UID, m.Process.Cwd)
			fmt.Fprintf(w, "command       %s\n", strings.Join(m.Process.Cmdline, " "))
			fmt.Fprintf(w, "size          %s in %d files, pages %s, RSS at dump %s\n", fmtSize(m.TotalSize()), len(m.Files), fmtSize(m.PagesSize()), fmtSize(m.Process.RSSBytes))
			fmt.Fprintf(w, "options       leave-running=%v tcp-close=%v shell-job=%v no-hooks=%v\n", m.Options.LeaveRunning, m.Options.TCPClose, m.Options.ShellJob, m.NoHooks)
			if m.ControlSocket != "" {
				fmt.Fprintf(w, "socket        %s\n", m.ControlSocket)
			}
			if n := m.CarriedRecords(); n > 0 {
				fmt.Fprintf(w, "carried       %d records (%s): sent by every restored copy\n", n, strings.Join(m.Carriers(), ", "))
			} else if !m.NoHooks {
				fmt.Fprintln(w, "carried       no records")
			}
			switch {
			case signer != nil:
				fmt.Fprintf(w, "signature     verified: signed by %s\n", images.Fingerprint(signer))
			case hasSignature(args[0]):
				fmt.Fprintln(w, "signature     present, not checked (pass --verify-key)")
			default:
				fmt.Fprintln(w, "signature     none")
			}
			fmt.Fprintln(w, "phases")
			for _, p := range m.Phases {
				fmt.Fprintf(w, "  %-20s %s\n", p.Name, fmtDur(p.Duration()))
			}
			if s := m.CRIUStats; s != (images.CRIUStats{}) {
				fmt.Fprintf(w, "criu          frozen %s (freezing %s, memdump %s, memwrite %s), pages scanned %d, written %d\n",
					fmtDur(time.Duration(s.FrozenTimeUS)*time.Microsecond), fmtDur(time.Duration(s.FreezingTimeUS)*time.Microsecond),
					fmtDur(time.Duration(s.MemdumpTimeUS)*time.Microsecond), fmtDur(time.Duration(s.MemwriteTimeUS)*time.Microsecond),
					s.PagesScanned, s.PagesWritten)
			}
			if len(m.Resources) > 0 {
				fmt.Fprintln(w, "resources (before-checkpoint hooks, in call order)")
				for _, r := range m.Resources {
					carried := ""
					if n := r.Carried(); n > 0 {
						carried = fmt.Sprintf(" carried %d", n)
					}
					fmt.Fprintf(w, "  %-20s %s%s%s\n", r.Name, fmtDur(r.Duration()), carried, details(r.Details))
				}
			}
			for _, x := range warn {
				fmt.Fprintln(stderr, "kcr: warning: "+x)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "read the manifest without checking the files' checksums")
	cmd.Flags().BoolVar(&rehash, "rehash", false, "hash every file, also those unchanged on disk since they were last verified")
	verifyKeyFlag(cmd.Flags(), &keyFiles)
	return cmd
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print kcr's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.json {
				return printJSON(map[string]string{"kcr": engine.Version, "go": runtime.Version()})
			}
			fmt.Printf("kcr %s (%s %s/%s)\n", engine.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

func doctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can checkpoint and restore, and say how to fix what is missing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			checks := engine.Doctor(cmd.Context(), g.criu)
			failed := 0
			for _, c := range checks {
				if !c.OK {
					failed++
				}
			}
			if g.json {
				if err := printJSON(checks); err != nil {
					return err
				}
			} else {
				for _, c := range checks {
					mark := "ok  "
					if !c.OK {
						mark = "FAIL"
					}
					fmt.Printf("%s %-28s %s\n", mark, c.Name, c.Detail)
					if c.Fix != "" {
						fmt.Printf("     %-28s fix: %s\n", "", c.Fix)
					}
				}
			}
			if failed > 0 {
				return &exitError{exitNoCRIU, fmt.Errorf("%d problem(s) found; see the fixes above", failed)}
			}
			return nil
		},
	}
}
