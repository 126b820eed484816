package notify_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kcr-dev/kcr/notify"
)

// TestPollsOpenNoFile: what a checkpoint polls while kcr dumps the app (its
// instance key, kcr's liveness) opens no file. CRIU dumps the fds open at
// the freeze, and one open on /proc/<pid>/stat made a restore fail: that
// PID's directory is gone where the copy runs (the soak, about once in 400
// cycles). The helper runs them with every fd slot taken.
func TestPollsOpenNoFile(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=nofd", "KCR_NOTIFY_TEST_PEER="+strconv.Itoa(os.Getpid()))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "OK") {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

// nofdHelper takes every fd slot below RLIMIT_NOFILE, checks that an open
// fails then, and calls the polls.
func nofdHelper() {
	fail := func(f string, a ...any) { fmt.Printf("FAIL "+f+"\n", a...); os.Exit(0) }
	before, err := notify.InstanceKey()
	if err != nil {
		fail("instance key: %v", err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		fail("%v", err)
	}
	lim := uint64(len(ents) + 8)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		fail("setrlimit: %v", err)
	}
	for {
		if _, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0); err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				fail("filling the fd table: %v", err)
			}
			break
		}
	}
	if _, err := os.ReadFile("/proc/self/stat"); !errors.Is(err, syscall.EMFILE) {
		fail("reading a file with no fd slot left: %v, want EMFILE", err)
	}
	after, err := notify.InstanceKey()
	if err != nil || after != before {
		fail("instance key with no fd slot left: %d, %v; want %d", after, err, before)
	}
	peer, _ := strconv.Atoi(os.Getenv("KCR_NOTIFY_TEST_PEER"))
	if notify.PeerGone(peer) {
		fail("the live test process (PID %d) is gone", peer)
	}
	if !notify.PeerGone(1 << 30) {
		fail("PID %d, which does not exist, is not gone", 1<<30)
	}
	fmt.Println("OK")
	os.Exit(0)
}
