package e2e

// Root-kcr against a second uid (docs/security-paths.md), through the CLI; the
// package tests of images, engine and criuaction hold the rest.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSecuritySignIntoSharedDir (finding 1 of docs/security-paths.md): as root, kcr checkpoint
// --sign (and plain checkpoint, and export) into a directory that uid
// 61001 owns is refused before the app is disturbed: that uid could swap
// in what root then signs. The app is left running, untouched.
func TestSecuritySignIntoSharedDir(t *testing.T) {
	need(t)
	keys := filepath.Join(t.TempDir(), "ops")
	runKCR(t, kcrOpts{must: true}, "keygen", "-o", keys)
	a := startApp(t)
	drop := sharedDir(t)
	pid := strconv.Itoa(a.pid)
	for _, args := range [][]string{
		{"checkpoint", "--sign", keys + ".key", "-o", filepath.Join(drop, "svc.img"), pid},
		{"checkpoint", "-o", filepath.Join(drop, "plain.img"), pid},
	} {
		r := runKCR(t, kcrOpts{log: logAll}, args...)
		if r.code != 5 || !strings.Contains(r.stderr, "belongs to uid 61001") {
			t.Errorf("kcr %s: exit %d %q; want exit 5 naming uid 61001", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if ents, _ := os.ReadDir(drop); len(ents) != 0 {
		t.Errorf("the refused checkpoints left %d entries in %s", len(ents), drop)
	}
	if !alive(a.pid) || len(names(a.events(), "before")) != 0 {
		t.Fatal("a refused checkpoint disturbed the app")
	}
	img := checkpointGone(t, a.pid, "--sign", keys+".key")
	r := runKCR(t, kcrOpts{log: logAll}, "export", img, "-o", filepath.Join(drop, "svc.tar.zst"))
	if r.code != 5 || !strings.Contains(r.stderr, "belongs to uid 61001") {
		t.Errorf("export into uid 61001's directory: exit %d %q; want exit 5 naming uid 61001", r.code, r.stderr)
	}
}
