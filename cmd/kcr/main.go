// Command kcr checkpoints and restores Go services with CRIU.
//
// Its exit codes are in exitcodes.go, which generates both every command's
// help (EXIT STATUS) and docs/cli.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/engine/container"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

type globals struct {
	json    bool
	verbose bool
	criu    string
}

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	// Before anything starts a child (CRIU, runc, the service, kcr
	// standby's own child as PID 1): a descriptor kcr inherited must not
	// reach them. engine.Run, which starts the service, reports an error.
	engine.CloseInheritedFDs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var g globals
	root := newRoot(&g)
	os.Args = asCRIUHook(os.Args)

	err := root.ExecuteContext(ctx)
	if err == nil {
		return
	}
	fmt.Fprintln(stderr, "kcr: "+err.Error())
	os.Exit(exitCode(err))
}

// newRoot returns the kcr command with all its subcommands, their flags
// parsed into g.
func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "kcr",
		Short:         "Checkpoint and restore Go services (and their Kafka clients) with CRIU",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			lvl := slog.LevelWarn
			if g.verbose {
				lvl = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})))
		},
	}
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print the result as JSON on stdout")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log debug details on stderr")
	root.PersistentFlags().StringVar(&g.criu, "criu", "", "path of the criu binary (default: $KCR_CRIU, then PATH)")
	root.AddCommand(checkpointCmd(g), restoreCmd(g), runCmd(g), inspectCmd(g), recoverCmd(g), doctorCmd(g), versionCmd(g), exportCmd(g), importCmd(g), keygenCmd(g), standbyCmd(g))
	root.AddCommand(criuHookCmd(g), installHookCmd(g))
	root.SetUsageTemplate(root.UsageTemplate() + exitStatusHelp)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &exitError{exitUsage, err} })
	return root
}

// exitCode maps an error to the documented exit codes: the one place that
// does, so that a code and its help text cannot drift apart.
func exitCode(err error) int {
	var ee *exitError
	var he *proto.HookFailure
	var ce *criu.Error
	var pe *criu.PIDInUseError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.Is(err, images.ErrSignature):
		return exitSignature
	case errors.As(err, &he) && he.CarryVeto(), errors.Is(err, engine.ErrDuplicates):
		return exitCarried
	case errors.As(err, &he):
		return exitHooks
	case errors.Is(err, criuaction.ErrNoEnv), errors.Is(err, criuaction.ErrNotAbsolute):
		return exitUsage
	case errors.Is(err, criu.ErrNotFound), errors.Is(err, engine.ErrCRIUUnusable):
		return exitNoCRIU
	case errors.Is(err, container.ErrNoRuntimeHook), errors.Is(err, container.ErrContainerState):
		return exitTarget
	case errors.As(err, &ce), errors.As(err, &pe), errors.Is(err, container.ErrRuntimeFailed):
		return exitCRIU
	case errors.Is(err, engine.ErrNotClonable), errors.Is(err, images.ErrNotRecoverable):
		return exitImage
	case errors.Is(err, proto.ErrNoProcess), errors.Is(err, client.ErrNoSocket),
		errors.Is(err, client.ErrUnsafeSocket):
		return exitTarget
	case isImageError(err):
		return exitImage
	case errors.Is(err, fs.ErrNotExist):
		// Not the image (that is an *images.Error): a key, a bundle, a
		// program, an output's directory, ... named on the command line.
		return exitUsage
	}
	return exitErr
}

// isImageError reports whether err is about the image or archive named on
// the command line: missing (images.ErrNotExist), incomplete or corrupt.
func isImageError(err error) bool {
	var ie *images.Error
	return errors.As(err, &ie)
}
