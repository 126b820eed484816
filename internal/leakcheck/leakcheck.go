// Package leakcheck finds the goroutines a test started and left running.
//
// A leak is a goroutine that runs after the test that was not running
// before it: the sets are compared by goroutine id (ids are never reused),
// so one goroutine left behind fails the check, whatever else ended.
// Leaks are reported grouped by where they were created.
package leakcheck

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Goroutine is one goroutine of a stack dump.
type Goroutine struct {
	ID int64
	// CreatedBy is the function that started it and the place of the go
	// statement, "pkg.f in goroutine 7 at /x/f.go:12"; empty for main.
	CreatedBy string
	Stack     string // the goroutine's whole entry of the dump
}

// Snapshot is the set of goroutines running at one instant, by id.
type Snapshot map[int64]Goroutine

// Take returns the goroutines running now but the caller's.
func Take() Snapshot {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	s := Snapshot{}
	for i, entry := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 {
			continue // the caller's own
		}
		if g, ok := parse(string(entry)); ok {
			s[g.ID] = g
		}
	}
	return s
}

// parse reads one entry of runtime.Stack: "goroutine 42 [chan receive]:",
// frames, and for all but main "created by f in goroutine N\n\tfile:line +0x..".
func parse(entry string) (Goroutine, bool) {
	head, _, _ := strings.Cut(strings.TrimPrefix(entry, "goroutine "), " ")
	id, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return Goroutine{}, false
	}
	g := Goroutine{ID: id, Stack: entry}
	if _, rest, ok := strings.Cut(entry, "\ncreated by "); ok {
		fn, loc, _ := strings.Cut(rest, "\n")
		loc, _, _ = strings.Cut(strings.TrimSpace(loc), " +0x")
		g.CreatedBy = fn + " at " + loc
	}
	return g, true
}

// Since returns the goroutines of now that were not in before and that
// match keeps (nil keeps all).
func (before Snapshot) Since(now Snapshot, keep func(Goroutine) bool) []Goroutine {
	var out []Goroutine
	for id, g := range now {
		if _, ok := before[id]; !ok && (keep == nil || keep(g)) {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b Goroutine) int { return int(a.ID - b.ID) })
	return out
}

// Check fails t unless every goroutine started since before that matches
// keep has ended within d; goroutines on their way out (a connection's
// reader seeing the close) get that long. The failure names each creation
// site with its count and one stack.
func Check(t testing.TB, before Snapshot, d time.Duration, keep func(Goroutine) bool) {
	t.Helper()
	var left []Goroutine
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if left = before.Since(Take(), keep); len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("%d goroutines started since the snapshot still run after %v:\n%s", len(left), d, Report(left))
}

// Report groups gs by creation site: a line per site with its count, then
// the stack of its first goroutine.
func Report(gs []Goroutine) string {
	bySite := map[string][]Goroutine{}
	var sites []string
	for _, g := range gs {
		if _, ok := bySite[g.CreatedBy]; !ok {
			sites = append(sites, g.CreatedBy)
		}
		bySite[g.CreatedBy] = append(bySite[g.CreatedBy], g)
	}
	slices.Sort(sites)
	var b strings.Builder
	for _, site := range sites {
		fmt.Fprintf(&b, "\n%d× created by %s\n%s\n", len(bySite[site]), site, bySite[site][0].Stack)
	}
	return b.String()
}
