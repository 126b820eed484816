package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"
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

// printJSON writes v as indented JSON on stdout; see writeJSON.
func printJSON(v any) error { return writeJSON(os.Stdout, v) }

// writeJSON writes v as indented JSON with every control character
// escaped. encoding/json escapes C0 but leaves DEL and C1 (U+0080–U+009F)
// raw, and a terminal may act on C1 (U+009B is CSI), so they become \u
// escapes too: the same JSON value, nothing a terminal acts on.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(escapeJSONControls(buf.Bytes()))
	return err
}

// escapeJSONControls rewrites DEL and C1 in encoded JSON as \u escapes.
// Outside strings JSON is ASCII without DEL, so every such rune is inside
// a string, where the escape means the same character.
func escapeJSONControls(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r == 0x7f || (r >= 0x80 && r <= 0x9f) }) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}
