package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestSafeWriter: a resource name, hook error, comm or cmdline holding
// terminal escapes reaches the terminal escaped, and cannot forge a line.
func TestSafeWriter(t *testing.T) {
	var b bytes.Buffer
	w := safeWriter{&b}
	evil := "db\x1b]0;owned\x07\x1b[2J\rkcr: restored OK\nfake line\u009b31m\x7f"
	fmt.Fprintf(w, "  hook %-15s %s\n", evil, "10ms")
	fmt.Fprintln(w, "kcr: "+evil)
	got := b.String()
	if strings.ContainsFunc(strings.ReplaceAll(got, "\n", ""), func(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }) {
		t.Errorf("control characters reached the terminal: %q", got)
	}
	if n := strings.Count(got, "\n"); n != 2 {
		t.Errorf("%d lines written for 2 calls: %q", n, got)
	}
	want := `  hook db\x1b]0;owned\x07\x1b[2J\x0dkcr: restored OK\x0afake line\u009b31m\x7f 10ms` + "\n"
	if !strings.HasPrefix(got, want) {
		t.Errorf("got %q\nwant prefix %q", got, want)
	}
	if termSafe("plain name é") != "plain name é" {
		t.Error("printable text changed")
	}
}
