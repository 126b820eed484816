package main

import (
	"fmt"
	"strings"
)

// Exit codes: exitCodes says what each means.
const (
	exitOK = iota
	exitErr
	exitUsage
	exitHooks
	exitCRIU
	exitImage
	exitTarget
	exitNoCRIU
	exitAfterHooks
	exitSignature
	exitCarried

	// exitInterrupted is the shell's code for death by SIGINT (128+2):
	// kcr stopped on a signal, after undoing what it had started.
	exitInterrupted = 130
)

// exitCodes is the one table of exit codes: every command's help (EXIT
// STATUS) and docs/cli.md are generated from it, and exitCode maps errors
// onto its codes.
var exitCodes = []struct {
	code int
	text string
}{
	{exitOK, "success"},
	{exitErr, "other error"},
	{exitUsage, "usage error, or a file named on the command line that is not the image " +
		"(a key, a bundle, a program, an output's directory) is missing"},
	{exitHooks, "the app's before-checkpoint hooks failed: nothing dumped, the app resumed"},
	{exitCRIU, "CRIU failed (dump or restore); the app, if it was running, resumed"},
	{exitImage, "the image (or archive) named on the command line is missing, incomplete or corrupt"},
	{exitTarget, "the target process does not exist or has no kcr control socket"},
	{exitNoCRIU, "CRIU is missing or unusable on this kernel"},
	{exitAfterHooks, "restored, but the after-restore hooks failed"},
	{exitSignature, "--verify-key: the image's signature is missing, malformed, by another key, " +
		"or the manifest or a file changed since it was signed"},
	{exitCarried, "carried records: --require-drained refused a checkpoint that would carry records, " +
		"or a resource that never carries could not flush (nothing dumped, the app resumed); " +
		"or a restore would send an image's carried records twice (nothing restored; --allow-duplicates)"},
	{exitInterrupted, "interrupted (SIGINT or SIGTERM); the app, if it was running, resumed"},
}

// exitStatusHelp is the EXIT STATUS section of every command's help.
var exitStatusHelp = func() string {
	var b strings.Builder
	b.WriteString("\nEXIT STATUS\n")
	for _, c := range exitCodes {
		for i, line := range wrap(c.text, 72) {
			if i == 0 {
				fmt.Fprintf(&b, "  %-4d %s\n", c.code, line)
			} else {
				fmt.Fprintf(&b, "       %s\n", line)
			}
		}
	}
	return b.String()
}()

// exitCodesMarkdown is the exit-code table of docs/cli.md.
func exitCodesMarkdown() string {
	var b strings.Builder
	b.WriteString("| code | meaning |\n|---|---|\n")
	for _, c := range exitCodes {
		fmt.Fprintf(&b, "| %d | %s |\n", c.code, c.text)
	}
	return b.String()
}

// wrap splits s into lines of at most width bytes at spaces (a longer word
// gets a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	return append(lines, line)
}
