package e2e

// Root-kcr against images and processes of other users (issue 8). The
// socket attacks run as package tests of notify/client with two uids; here
// is what needs the CLI and CRIU.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const otherUID = 61001

func chownR(t *testing.T, dir string, uid int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSecurityUntrustedImage: root does not restore an image that another
// uid owns (CRIU would recreate whatever it describes with root's powers),
// unless told to with --allow-untrusted.
func TestSecurityUntrustedImage(t *testing.T) {
	need(t)
	a := startApp(t)
	img := filepath.Join(t.TempDir(), "img")
	mustKCR(t, "checkpoint", "-o", img, strconv.Itoa(a.pid))
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the checkpointed process is still running")
	}
	chownR(t, img, otherUID)
	r := kcr(t, "restore", img)
	if r.code != 5 || !strings.Contains(r.stderr, "belongs to uid 61001") || !strings.Contains(r.stderr, "--allow-untrusted") {
		t.Fatalf("restore of an image of uid %d: exit %d %q; want exit 5 naming the owner and --allow-untrusted", otherUID, r.code, r.stderr)
	}
	if alive(a.pid) {
		t.Fatal("the untrusted image was restored")
	}
	if _, err := os.Lstat(filepath.Join(img, "restores")); err == nil {
		t.Error("root wrote a restore counter into another user's image")
	}
	restore(t, img, "--allow-untrusted")
}

// TestSecurityNegativeFlags: negative durations and counts are refused
// before anything happens.
func TestSecurityNegativeFlags(t *testing.T) {
	need(t)
	a := startApp(t)
	pid := strconv.Itoa(a.pid)
	img := t.TempDir()
	for _, args := range [][]string{
		{"checkpoint", "--timeout", "-1s", "-o", filepath.Join(img, "a"), pid},
		{"checkpoint", "--resume-after", "-5s", "-o", filepath.Join(img, "b"), pid},
		{"restore", "--count", "-2", img},
		{"restore", "--wait", "-1s", img},
	} {
		r := kcr(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "negative") {
			t.Errorf("kcr %s: exit %d %q; want exit 2 saying it is negative", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if !alive(a.pid) || len(names(a.events(), "before")) != 0 {
		t.Fatal("a refused command disturbed the app")
	}
}
