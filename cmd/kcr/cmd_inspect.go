package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/images"
)

// inspectOpts are inspect's arguments and flags.
type inspectOpts struct {
	cmdline
	noVerify bool
	rehash   bool
	keyFiles []string
}

func inspectCmd(g *globals) *cobra.Command {
	var opts inspectOpts
	cmd := &cobra.Command{
		Use:   "inspect IMAGE",
		Short: "Show an image's manifest, sizes and timings",
		Args:  cobra.ExactArgs(1),
		RunE:  runE(g, &opts, runInspect),
	}
	cmd.Flags().BoolVar(&opts.noVerify, "no-verify", false, "read the manifest without checking the files' checksums")
	cmd.Flags().BoolVar(&opts.rehash, "rehash", false, "hash every file, also those unchanged on disk since they were last verified")
	verifyKeyFlag(cmd.Flags(), &opts.keyFiles)
	return cmd
}

// runInspect runs kcr inspect: results on out's stdout, the report on its stderr.
func runInspect(ctx context.Context, opts *inspectOpts, out *output) error {
	keys, err := loadVerifyKeys(opts.keyFiles)
	if err != nil {
		return err
	}
	if opts.noVerify && keys != nil {
		return &exitError{exitUsage, errors.New("--no-verify skips the checks that --verify-key asks for: drop one of them")}
	}
	in, err := readInspected(ctx, opts, keys)
	if err != nil {
		return err
	}
	if out.json {
		return out.JSON(in.m)
	}
	w := safeWriter{out.stdout}
	printImageHeader(w, opts.args[0], in)
	printImageSteps(w, in.m)
	for _, x := range in.warn {
		fmt.Fprintln(out.stderr, "kcr: warning: "+x)
	}
	return nil
}

// inspected is an image's manifest as kcr inspect read it, with what the
// check found when it was verified.
type inspected struct {
	m        *images.Manifest
	verified bool
	warn     []string
	signer   ed25519.PublicKey
	cached   int // files unchanged since their last check, not hashed again
}

// readInspected reads the image's manifest, verifying the image unless
// --no-verify.
func readInspected(ctx context.Context, opts *inspectOpts, keys []ed25519.PublicKey) (inspected, error) {
	if opts.noVerify {
		m, err := images.ReadManifest(opts.args[0])
		return inspected{m: m}, err
	}
	img, err := images.OpenWith(ctx, opts.args[0], images.OpenOptions{Rehash: opts.rehash, VerifyKeys: keys})
	if err != nil {
		return inspected{}, err
	}
	img.Close()
	return inspected{m: img.Manifest, verified: true, warn: img.Warnings, signer: img.Signer, cached: img.Cached}, nil
}

// printImageHeader prints what the image is: its origin, process, size,
// options, carried records and signature.
func printImageHeader(w io.Writer, path string, in inspected) {
	m := in.m
	verified := "not verified"
	if in.verified {
		verified = fmt.Sprintf("verified: %d files hashed, %d unchanged since their last check", len(m.Files)-in.cached, in.cached)
	}
	fmt.Fprintf(w, "image         %s (format %s v%d, %s)\n", path, m.Format, m.FormatVersion, verified)
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
	case in.signer != nil:
		fmt.Fprintf(w, "signature     verified: signed by %s\n", images.Fingerprint(in.signer))
	case hasSignature(path):
		fmt.Fprintln(w, "signature     present, not checked (pass --verify-key)")
	default:
		fmt.Fprintln(w, "signature     none")
	}
}

// printImageSteps prints how the checkpoint went: its phases, CRIU's
// statistics and each hooked resource's before-checkpoint.
func printImageSteps(w io.Writer, m *images.Manifest) {
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
}
