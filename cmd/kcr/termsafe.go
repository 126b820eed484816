package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"
)

// termSafe escapes the control characters in s (C0, DEL, C1, as \x1b or
// \u009b), so that names, errors, cmdlines and comms chosen by a target or
// an image's author cannot move root's cursor, retitle its terminal or
// forge lines.
func termSafe(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// safeWriter writes human output through termSafe. Each Write is one line
// of kcr's output, so only its final newline is kept as is.
type safeWriter struct{ w io.Writer }

func (s safeWriter) Write(p []byte) (int, error) {
	line, nl := strings.CutSuffix(string(p), "\n")
	out := termSafe(line)
	if nl {
		out += "\n"
	}
	if _, err := io.WriteString(s.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// stderr is where kcr's human output goes.
var stderr io.Writer = safeWriter{os.Stderr}
