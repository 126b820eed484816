package client

import (
	"strings"
	"testing"
)

// FuzzParseUnixTable feeds arbitrary /proc/<pid>/net/unix text: the parser
// must not panic, and whatever it returns is an absolute path without
// control characters, at most one per wanted inode.
func FuzzParseUnixTable(f *testing.F) {
	f.Add(unixSample, "41836")
	f.Add("Num RefCount Protocol Flags Type St Inode Path\n0: 2 0 10000 1 1 7 /a/kcr-1.sock\n0: 2 0 10000 1 1 7 /b\n", "7")
	f.Add("h\n0: 2 0 10000 1 1 7 /a\x1b[2J/kcr-1.sock\n", "7")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, table, inodes string) {
		want := map[string]bool{}
		for _, ino := range strings.Fields(inodes) {
			want[ino] = true
		}
		got, err := parseUnixTable(strings.NewReader(table), want)
		if err != nil {
			return
		}
		if len(got) > len(want) {
			t.Fatalf("%d paths for %d inodes", len(got), len(want))
		}
		for _, p := range got {
			if !strings.HasPrefix(p, "/") || strings.IndexFunc(p, isControl) >= 0 {
				t.Fatalf("unsafe path %q", p)
			}
		}
	})
}
