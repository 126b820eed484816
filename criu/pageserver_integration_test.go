package criu

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// holders lists the processes whose working directory or open files are
// under dir.
func holders(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		links := []string{"/proc/" + e.Name() + "/cwd"}
		fds, _ := os.ReadDir("/proc/" + e.Name() + "/fd")
		for _, fd := range fds {
			links = append(links, "/proc/"+e.Name()+"/fd/"+fd.Name())
		}
		for _, l := range links {
			if to, err := os.Readlink(l); err == nil && (to == dir || strings.HasPrefix(to, dir+"/")) {
				cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
				out = append(out, fmt.Sprintf("%s (%s)", e.Name(), strings.ReplaceAll(string(cmd), "\x00", " ")))
				break
			}
		}
	}
	return out
}

// A page server abandoned at any moment of its start, while CRIU probes the
// CPU through a helper process it forks and later kills, leaves no process
// behind: killed then, it left the helper asleep for good, holding the
// images directory.
func TestE2EPageServerAbandonedAtStartLeavesNothing(t *testing.T) {
	criu := needCRIU(t)
	dir := mkdir(t, "img")
	for i := range 100 {
		ps, err := newPageServer()
		if err != nil {
			t.Fatal(err)
		}
		d, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.start(context.Background(), criu, d, 2); err != nil {
			t.Fatal(err)
		}
		d.Close()
		time.Sleep(time.Duration(i%50) * 200 * time.Microsecond)
		if err := ps.finish(true); err != nil {
			t.Fatal(err)
		}
	}
	var left []string
	wait.Until(5*time.Second, func() bool {
		left = holders(dir)
		return len(left) == 0
	})
	if len(left) > 0 {
		t.Fatalf("processes left holding the images directory after their page server was abandoned: %v", left)
	}
}
