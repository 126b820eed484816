package imagetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// NeedRoot skips a test that must act as another uid when not root, and
// fails it in CI, where it must run.
func NeedRoot(t testing.TB) {
	t.Helper()
	NeedRootTo(t, "act as another uid")
}

// NeedRootTo is NeedRoot for a test that needs root to do what.
func NeedRootTo(t testing.TB, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to " + what)
		}
		t.Skip("needs root to " + what)
	}
}

// AsOther starts sh -c script as uid OtherUID; it is killed at the end of
// the test.
func AsOther(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: OtherUID, Gid: OtherUID}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// LinkedDir makes uid OtherUID's directory U holding "logs", its link to a
// root-only directory that holds secret.txt; it returns U and the secret.
func LinkedDir(t *testing.T) (string, string) {
	t.Helper()
	rootOnly := t.TempDir()
	secret := filepath.Join(rootOnly, "secret.txt")
	os.WriteFile(secret, []byte("root's\n"), 0o600)
	u := filepath.Join(t.TempDir(), "U")
	os.Mkdir(u, 0o755)
	os.Chmod(filepath.Dir(u), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(u)), 0o755)
	os.Chown(u, OtherUID, OtherUID)
	AsOther(t, "ln -s "+rootOnly+" "+filepath.Join(u, "logs")).Wait()
	return u, secret
}
