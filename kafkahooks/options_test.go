package kafkahooks

import (
	"testing"
	"time"
)

// Options that apply to one constructor must not be accepted by another:
// NewReader takes ReaderOpt, NewWriter WriterOpt; Opt fits both.
func TestOptionsNamespaced(t *testing.T) {
	cases := []struct {
		name           string
		o              any
		writer, reader bool
	}{
		{"WithRetryBackoff", WithRetryBackoff(time.Millisecond, time.Second), true, false},
		{"WithUnflushedCommits", WithUnflushedCommits(), false, true},
		{"WithOffsetsCheckAfter", WithOffsetsCheckAfter(0), false, true},
		{"WithClientID", WithClientID("x"), true, true},
		{"WithName", WithName("x"), true, true},
		{"WithRegistry", WithRegistry(nil), true, true},
		{"WithLogger", WithLogger(nil), true, true},
	}
	for _, c := range cases {
		_, w := c.o.(WriterOpt)
		_, r := c.o.(ReaderOpt)
		if w != c.writer || r != c.reader {
			t.Errorf("%s: writer %v reader %v, want %v %v", c.name, w, r, c.writer, c.reader)
		}
	}
}
