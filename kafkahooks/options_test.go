package kafkahooks

import (
	"testing"
	"time"
)

// Options that apply to one constructor must not be accepted by another:
// NewReader takes ReaderOpt, NewWriter WriterOpt, the helpers Opt.
func TestOptionsNamespaced(t *testing.T) {
	cases := []struct {
		name           string
		o              any
		writer, reader bool
		helper         bool
	}{
		{"WithRetryBackoff", WithRetryBackoff(time.Millisecond, time.Second), true, false, false},
		{"WithUnflushedCommits", WithUnflushedCommits(), false, true, false},
		{"WithClientID", WithClientID("x"), true, true, false},
		{"WithName", WithName("x"), true, true, true},
		{"WithRegistry", WithRegistry(nil), true, true, true},
		{"WithLogger", WithLogger(nil), true, true, true},
	}
	for _, c := range cases {
		_, w := c.o.(WriterOpt)
		_, r := c.o.(ReaderOpt)
		_, h := c.o.(Opt)
		if w != c.writer || r != c.reader || h != c.helper {
			t.Errorf("%s: writer %v reader %v helper %v, want %v %v %v", c.name, w, r, h, c.writer, c.reader, c.helper)
		}
	}
}
