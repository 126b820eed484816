package e2e

// Root-kcr against images and processes of other users. The
// socket attacks run as package tests of notify/client with two uids; here
// is what needs the CLI and CRIU.

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestSecurityUntrustedImage: root does not restore an image that another
// uid owns (CRIU would recreate whatever it describes with root's powers),
// unless told to with --allow-untrusted.
func TestSecurityUntrustedImage(t *testing.T) {
	need(t)
	a := startApp(t)
	img := checkpointGone(t, a.pid)
	imagetest.ChownAll(t, img, imagetest.OtherUID)
	r := runKCR(t, kcrOpts{log: logAll}, "restore", img)
	if r.code != 5 || !strings.Contains(r.stderr, "belongs to uid 61001") || !strings.Contains(r.stderr, "--allow-untrusted") {
		t.Fatalf("restore of an image of uid %d: exit %d %q; want exit 5 naming the owner and --allow-untrusted", imagetest.OtherUID, r.code, r.stderr)
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
		{"checkpoint", "--hook-budget", "-1s", "-o", filepath.Join(img, "a"), pid},
		{"checkpoint", "--resume-after", "-5s", "-o", filepath.Join(img, "b"), pid},
		{"restore", "--count", "-2", img},
		{"restore", "--wait", "-1s", img},
	} {
		r := runKCR(t, kcrOpts{log: logAll}, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "negative") {
			t.Errorf("kcr %s: exit %d %q; want exit 2 saying it is negative", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if !alive(a.pid) || len(names(a.events(), "before")) != 0 {
		t.Fatal("a refused command disturbed the app")
	}
}

// TestSecurityImageSwappedAfterVerify: the image directory renamed away
// and replaced after kcr verified it, before CRIU reads it, changes
// nothing: CRIU reads the directory kcr verified, through its descriptor.
func TestSecurityImageSwappedAfterVerify(t *testing.T) {
	need(t)
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) { swappedAfterVerify(t, mode == "lazy") })
	}
}

// swappedAfterVerify is TestSecurityImageSwappedAfterVerify; with lazy, the
// lazy-pages daemon must read the pages through the verified directory too.
func swappedAfterVerify(t *testing.T, lazy bool) {
	a := startApp(t)
	img := checkpointGone(t, a.pid)
	args := []string{"restore", "--json", img}
	if lazy {
		args = append(args, "--lazy")
	}
	cmd := kcrOpts{env: []string{"KCR_TEST_STALL_AFTER_VERIFY=3s"}}.cmd(args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // verified by now; CRIU not yet started
	if err := os.Rename(img, img+".verified"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(img, "criu"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"inventory.img", "pstree.img", "core-1.img", "pagemap-1.img", "pages-1.img"} {
		os.WriteFile(filepath.Join(img, "criu", f), []byte("swapped in after verification"), 0o600)
	}
	err := cmd.Wait()
	t.Logf("kcr restore -> %v\n%s%s", err, se.String(), so.String())
	if err != nil {
		t.Fatalf("restore after the swap: %v %q; want the verified image restored", err, se.String())
	}
	out := oneRestore(t, so.String())
	pid := int(out["pid"].(float64))
	t.Cleanup(func() { killWait(pid) })
	if lazy {
		if lp, _ := out["lazy_pages_pid"].(float64); lp > 0 {
			t.Cleanup(func() { killWait(int(lp)) })
		}
	}
	// Time for the app to touch its memory (with lazy, served by the
	// daemon) and report it.
	time.Sleep(time.Second)
	if !alive(pid) {
		t.Fatal("restored process is not running")
	}
	a.waitEvent(5*time.Second, func(e event) bool { return e["ev"] == "after" })
	if !alive(pid) {
		t.Fatal("restored process died after its hooks")
	}
}
