package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

// versionOpts are version's arguments and flags.
type versionOpts struct {
	globals
	args []string
}

func versionCmd(g *globals) *cobra.Command {
	var opts versionOpts
	return &cobra.Command{
		Use:   "version",
		Short: "Print kcr's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.args, opts.globals = args, *g
			return runVersion(cmd.Context(), &opts, newOutput(g))
		},
	}
}

// runVersion runs kcr version: results on out's stdout, the report on its stderr.
func runVersion(ctx context.Context, opts *versionOpts, out *output) error {
	if out.json {
		return out.JSON(map[string]string{"kcr": engine.Version, "go": runtime.Version()})
	}
	fmt.Fprintf(out.stdout, "kcr %s (%s %s/%s)\n", engine.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
