package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

// doctorOpts are doctor's arguments and flags.
type doctorOpts struct {
	globals
	args []string
}

func doctorCmd(g *globals) *cobra.Command {
	var opts doctorOpts
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can checkpoint and restore, and say how to fix what is missing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.args, opts.globals = args, *g
			return runDoctor(cmd.Context(), &opts, newOutput(g))
		},
	}
}

// runDoctor runs kcr doctor: results on out's stdout, the report on its stderr.
func runDoctor(ctx context.Context, opts *doctorOpts, out *output) error {
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
