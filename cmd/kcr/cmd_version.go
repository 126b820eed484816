package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

func versionCmd(g *globals) *cobra.Command {
	// No flags of its own: its options are the global flags.
	return &cobra.Command{Use: "version", Args: cobra.NoArgs, RunE: runE(g, &cmdline{}, runVersion),
		Short: "Print kcr's version"}
}

// versionJSON is kcr version --json's one shape.
type versionJSON struct {
	KCR string `json:"kcr"`
	Go  string `json:"go"`
}

// runVersion runs kcr version: results on out's stdout, the report on its stderr.
func runVersion(ctx context.Context, opts *cmdline, out *output) error {
	if out.json {
		return out.JSON(versionJSON{KCR: engine.Version, Go: runtime.Version()})
	}
	fmt.Fprintf(out.stdout, "kcr %s (%s %s/%s)\n", engine.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
