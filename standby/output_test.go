package standby

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

// writes records each Write.
type writes struct {
	mu sync.Mutex
	w  [][]byte
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.w = append(w.w, append([]byte(nil), p...))
	return len(p), nil
}

func (w *writes) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.Join(w.w, nil))
}

// Lines read in pieces of one byte go on whole: every Write but the last
// (a line without its newline at the end of the stream) ends a line.
func TestForwardLinesWhole(t *testing.T) {
	in := "one\ntwo two\n" + strings.Repeat("z", 70<<10) + "\nlast"
	var w writes
	forwardLines(iotest.OneByteReader(strings.NewReader(in)), &w)
	if got := w.all(); got != in {
		t.Fatalf("forwarded %d bytes, want the %d written", len(got), len(in))
	}
	for i, p := range w.w[:len(w.w)-1] {
		if !bytes.HasSuffix(p, []byte("\n")) {
			t.Fatalf("write %d of %d does not end a line: %q", i, len(w.w), p[max(0, len(p)-20):])
		}
	}
	if last := w.w[len(w.w)-1]; string(last) != "last" {
		t.Fatalf("last write %q, want the unterminated line", last)
	}
}

// A line longer than maxLine goes on in pieces, memory bounded.
func TestForwardLinesLong(t *testing.T) {
	in := strings.Repeat("q", 3*maxLine) + "\n"
	var w writes
	forwardLines(strings.NewReader(in), &w)
	if got := w.all(); got != in {
		t.Fatalf("forwarded %d bytes, want %d", len(got), len(in))
	}
	for _, p := range w.w {
		if len(p) > maxLine {
			t.Fatalf("a write of %d bytes, want at most %d", len(p), maxLine)
		}
	}
}

// The pipes of serviceOutput carry each stream to its writer; close passes
// on what was written before it.
func TestServiceOutputPipes(t *testing.T) {
	var out, errw writes
	o, err := newServiceOutput(&out, &errw)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(o.stdout, "to stdout\n")
	io.WriteString(o.stderr, "to stderr\npartial")
	o.close(10 * time.Second)
	if out.all() != "to stdout\n" || errw.all() != "to stderr\npartial" {
		t.Fatalf("stdout %q, stderr %q", out.all(), errw.all())
	}
}

// --log - refuses --on-term leave: the service left running would lose its
// stdout with kcr standby.
func TestLogStdioOnTermLeave(t *testing.T) {
	o := testOptions(t.TempDir())
	o.Log, o.OnTerm = LogStdio, TermLeave
	if err := o.check(); !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), "--on-term") {
		t.Fatalf("%v, want ErrBadOption naming --on-term", err)
	}
	o = testOptions(t.TempDir())
	o.Log, o.OnTerm = LogStdio, TermStop
	if err := o.check(); err != nil {
		t.Fatalf("--log - --on-term stop: %v", err)
	}
}
