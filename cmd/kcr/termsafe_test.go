package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/kcr-dev/kcr/images"
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

// TestInspectEscapes: kcr inspect of an image whose comm, cmdline and
// resource names hold terminal escapes prints them escaped.
func TestInspectEscapes(t *testing.T) {
	esc := "\x1b]0;pwned\x07\x1b[2J"
	final := writeImage(t, &images.Manifest{Created: time.Now(), Process: images.Process{PID: 7, Comm: "app" + esc, Cmdline: []string{"app", esc}},
		Resources: []images.ResourceReport{{Name: "db" + esc, DurationNS: 1}}}, "")
	s, err, _ := run(t, inspectCmd(&globals{}), final)
	if err != nil {
		t.Fatal(err)
	}
	out := []byte(s)
	if bytes.ContainsRune(out, 0x1b) || bytes.ContainsRune(out, 0x07) {
		t.Errorf("escapes reached the terminal:\n%q", out)
	}
	for _, want := range []string{`app\x1b]0;pwned\x07\x1b[2J`, `db\x1b]0;pwned`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// rawControl reports a control character other than the newlines and
// indentation of JSON itself.
func rawControl(b []byte) bool {
	return bytes.ContainsFunc(b, func(r rune) bool {
		return r != '\n' && r != ' ' && unicode.IsControl(r)
	})
}

// TestWriteJSONEscapesControls: DEL and C1 characters, which encoding/json
// leaves raw, are written as \u escapes, and the JSON decodes to the same
// strings.
func TestWriteJSONEscapesControls(t *testing.T) {
	evil := "db\x7f\u0085\u009b31m\u009d0;owned\x1b[2J é ✓"
	var b bytes.Buffer
	if err := writeJSON(&b, map[string]any{"name": evil, "list": []string{evil}}); err != nil {
		t.Fatal(err)
	}
	if rawControl(b.Bytes()) {
		t.Errorf("raw control characters in the JSON: %q", b.String())
	}
	for _, want := range []string{`\u007f`, `\u0085`, `\u009b`, `\u009d`, `\u001b`, "é ✓"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("JSON lacks %s: %s", want, b.String())
		}
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back["name"] != evil || back["list"].([]any)[0] != evil {
		t.Errorf("round trip changed the string: %q", back["name"])
	}
}

// TestInspectJSONEscapes: kcr inspect --json of an image whose comm,
// cmdline and resource names hold C1 controls and DEL prints them escaped.
func TestInspectJSONEscapes(t *testing.T) {
	c1 := "\u009b2J\u009d0;pwned\u009c\x7f"
	final := writeImage(t, &images.Manifest{Created: time.Now(), Process: images.Process{PID: 7, Comm: "app" + c1, Cmdline: []string{"app", c1}},
		Resources: []images.ResourceReport{{Name: "db" + c1, DurationNS: 1, Error: "failed" + c1}}}, "")
	out, err, _ := run(t, inspectCmd(&globals{json: true}), final)
	if err != nil {
		t.Fatal(err)
	}
	if rawControl([]byte(out)) {
		t.Errorf("raw C1 or DEL in kcr inspect --json:\n%q", out)
	}
	var got images.Manifest
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Process.Comm != "app"+c1 || got.Resources[0].Name != "db"+c1 {
		t.Errorf("the JSON does not decode to the names: %q %q", got.Process.Comm, got.Resources[0].Name)
	}
}
