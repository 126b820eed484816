package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

// phaseLines prints one line per phase on stderr.
func phaseLines(w io.Writer, t engine.Timings) {
	for _, p := range t {
		fmt.Fprintf(w, "  %-20s %s\n", p.Name, fmtDur(p.Duration()))
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

// nonNil is s, or an empty list for nil: --json prints [], not null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// output is where a command prints: its result on stdout (a PID, a table,
// or with --json one JSON value), the human report on stderr.
type output struct {
	stdout io.Writer
	stderr io.Writer
	json   bool
}

func newOutput(g *globals) *output {
	return &output{stdout: os.Stdout, stderr: stderr, json: g.json}
}

// JSON writes v on stdout; see writeJSON.
func (o *output) JSON(v any) error { return writeJSON(o.stdout, v) }

// cmdline is what cobra hands every command: the global flags and the
// arguments. Each command's options embed it.
type cmdline struct {
	globals
	args []string
}

func (c *cmdline) set(g *globals, args []string) { c.globals, c.args = *g, args }

// runE is every command's cobra RunE: it gives opts the global flags and
// the arguments, and calls run (the command's testable run<Name>) with the
// process's output.
func runE[P interface{ set(*globals, []string) }](g *globals, opts P, run func(context.Context, P, *output) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		opts.set(g, args)
		return run(cmd.Context(), opts, newOutput(g))
	}
}
