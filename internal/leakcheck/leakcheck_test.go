package leakcheck

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestSinceFindsNewGoroutineBySite(t *testing.T) {
	before := Take()
	stop := startParked()
	left := before.Since(Take(), nil)
	stop()
	if len(left) != 1 {
		t.Fatalf("%d new goroutines, want 1:%s", len(left), Report(left))
	}
	if site := left[0].CreatedBy; !strings.Contains(site, "leakcheck.startParked") || !strings.Contains(site, "leakcheck_test.go:") {
		t.Errorf("created by %q, want startParked and its file:line", site)
	}
	if !strings.Contains(left[0].Stack, "leakcheck.park") {
		t.Errorf("stack lacks the goroutine's function:\n%s", left[0].Stack)
	}
	if r := Report(left); !strings.Contains(r, "1× created by ") {
		t.Errorf("report %q lacks the count of the site", r)
	}
}

func TestSinceKeep(t *testing.T) {
	before := Take()
	defer startParked()()
	if left := before.Since(Take(), func(g Goroutine) bool { return strings.Contains(g.Stack, "no such function") }); len(left) != 0 {
		t.Errorf("keep filtered nothing: %s", Report(left))
	}
}

// Check waits for a goroutine on its way out instead of failing at once.
func TestCheckWaitsForEnding(t *testing.T) {
	before := Take()
	time.AfterFunc(50*time.Millisecond, startParked())
	Check(t, before, 5*time.Second, nil)
}

// Check fails on a goroutine that stays.
func TestCheckFailsOnLeak(t *testing.T) {
	before := Take()
	defer startParked()()
	rec := &recorder{TB: t}
	Check(rec, before, 50*time.Millisecond, nil)
	if !strings.Contains(rec.msg, "1 goroutines started since the snapshot") || !strings.Contains(rec.msg, "leakcheck.park") {
		t.Errorf("Check on a leak reported %q", rec.msg)
	}
}

// startParked starts a goroutine that parks until the returned stop.
func startParked() (stop func()) {
	started, done := make(chan struct{}), make(chan struct{})
	go park(started, done)
	<-started
	return func() { close(done) }
}

func park(started, stop chan struct{}) {
	close(started)
	<-stop
}

// recorder is a testing.TB whose Errorf records instead of failing.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
}
