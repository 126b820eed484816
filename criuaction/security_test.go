package criuaction

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const (
	attackerUID = 61001 // pre-creates the state directory
	victimUID   = 61002 // runs kcr-hook
)

// TestSecurityHookStateDirPlanted (finding 6 of docs/security-paths.md): uid 61001 pre-creates
// $TMPDIR/kcr-criu-hook, mode 0777, with a link named criu-PID.json.tmp to
// a file of uid 61002. When 61002's hook writes its state, that file must
// stay as it was, and a state directory 61002 does not own is refused.
func TestSecurityHookStateDirPlanted(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to act as two other uids")
		}
		t.Skip("needs root to act as two other uids")
	}
	base := t.TempDir()
	for p := base; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	tmp := filepath.Join(base, "tmp") // the users' shared $TMPDIR
	os.Mkdir(tmp, 0o777)
	os.Chmod(tmp, 0o777|os.ModeSticky)
	home := filepath.Join(base, "victim")
	os.Mkdir(home, 0o700)
	os.Chown(home, victimUID, victimUID)
	victim := filepath.Join(home, "notes")
	os.WriteFile(victim, []byte("61002's\n"), 0o600)
	os.Chown(victim, victimUID, victimUID)
	planted := filepath.Join(tmp, "kcr-criu-hook")
	run(t, attackerUID, nil, "mkdir "+planted+" && chmod 0777 "+planted+" && ln -s "+victim+" "+planted+"/criu-4242.json.tmp")

	// kcr-hook as 61002, with its default state directory and with the
	// planted one named.
	bin := filepath.Join(base, "hook.test")
	copyFile(t, os.Args[0], bin)
	out := run(t, victimUID, []string{"TMPDIR=" + tmp, "KCR_TEST_HOOK_AS_VICTIM=1"}, bin)
	if b, _ := os.ReadFile(victim); string(b) != "61002's\n" {
		t.Errorf("61002's file was overwritten through 61001's link: %q\n%s", b, out)
	}
	if !strings.Contains(out, "default: ok in "+filepath.Join(tmp, "kcr-criu-hook-61002")) {
		t.Errorf("the default state directory of a user is not its own: %s", out)
	}
	if !strings.Contains(out, "planted: refused: ") || !strings.Contains(out, "belongs to uid 61001") {
		t.Errorf("the planted state directory was used: %s", out)
	}
}

// init is, when KCR_TEST_HOOK_AS_VICTIM is set, the hook of uid 61002 in
// TestSecurityHookStateDirPlanted: it writes a state with the default
// state directory, then with the planted one, and exits.
func init() {
	if os.Getenv("KCR_TEST_HOOK_AS_VICTIM") == "" {
		return
	}
	os.Unsetenv("XDG_RUNTIME_DIR")
	o := Options{}
	o.defaults()
	if p, err := writeState(o, state{CRIUPID: 4242}); err != nil {
		fmt.Printf("default: error: %v\n", err)
	} else {
		fmt.Printf("default: ok in %s\n", filepath.Dir(p))
	}
	o.StateDir = filepath.Join(os.TempDir(), "kcr-criu-hook")
	if _, err := writeState(o, state{CRIUPID: 4242}); err != nil {
		fmt.Printf("planted: refused: %v\n", err)
	} else {
		fmt.Printf("planted: written\n")
	}
	os.Exit(0)
}

// run runs sh -c script as uid, with env added, and returns its output.
func run(t *testing.T, uid int, env []string, script string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as uid %d: %s: %v\n%s", uid, script, err, out)
	}
	return string(out)
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
