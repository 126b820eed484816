package engine

import (
	"os"
	"path/filepath"
	"testing"
)

// The control socket's missing directories are made (the socket's own
// 0700) below a trusted directory; an existing one is left alone, and
// nothing is made below a directory others may write.
func TestMakeSocketDir(t *testing.T) {
	root := t.TempDir()
	sock := filepath.Join(root, "run", "kcr", "app.sock")
	if err := makeSocketDir(sock, os.Geteuid()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v, %v; want a 0700 directory", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "run")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("parent: %v, %v; want 0755", fi, err)
	}
	os.Chmod(filepath.Dir(sock), 0o750)
	if err := makeSocketDir(sock, os.Geteuid()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Dir(sock)); fi.Mode().Perm() != 0o750 {
		t.Errorf("an existing directory was changed to %v", fi.Mode().Perm())
	}

	open := filepath.Join(root, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	if err := makeSocketDir(filepath.Join(open, "kcr", "app.sock"), os.Geteuid()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(open, "kcr")); !os.IsNotExist(err) {
		t.Errorf("a directory was made below a world-writable one: %v", err)
	}
	for _, p := range []string{"", "relative/app.sock"} {
		if err := makeSocketDir(p, 0); err != nil {
			t.Errorf("makeSocketDir(%q): %v", p, err)
		}
	}
}
