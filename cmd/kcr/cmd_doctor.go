package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

func doctorCmd(g *globals) *cobra.Command {
	// No flags of its own: its options are the global flags.
	return &cobra.Command{Use: "doctor", Args: cobra.NoArgs, RunE: runE(g, &cmdline{}, runDoctor),
		Short: "Check that this machine can checkpoint and restore, and say how to fix what is missing"}
}

// runDoctor runs kcr doctor: results on out's stdout, the report on its stderr.
func runDoctor(ctx context.Context, opts *cmdline, out *output) error {
	g := &opts.globals
	checks := engine.Doctor(ctx, g.criu)
	failed := 0
	for _, c := range checks {
		if !c.OK {
			failed++
		}
	}
	if out.json {
		if err := out.JSON(checks); err != nil {
			return err
		}
	} else {
		for _, c := range checks {
			mark := "ok  "
			if !c.OK {
				mark = "FAIL"
			}
			fmt.Fprintf(out.stdout, "%s %-28s %s\n", mark, c.Name, c.Detail)
			if c.Fix != "" {
				fmt.Fprintf(out.stdout, "     %-28s fix: %s\n", "", c.Fix)
			}
		}
	}
	if failed > 0 {
		return &exitError{exitNoCRIU, fmt.Errorf("%d problem(s) found; see the fixes above", failed)}
	}
	return nil
}
