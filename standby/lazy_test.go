package standby

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/images"
)

// writeSizedImage makes image name in dir whose manifest lists CRIU page
// files of pages bytes in all (and another file, which must not count).
func writeSizedImage(t *testing.T, dir, name string, pages int64) {
	t.Helper()
	sum := strings.Repeat("ab", 32)
	m := images.Manifest{Format: images.Format, FormatVersion: images.FormatVersion, Files: []images.FileEntry{
		{Path: images.CRIUSubdir + "/pages-1.img", Size: pages / 2, SHA256: sum},
		{Path: images.CRIUSubdir + "/pages-2.img", Size: pages - pages/2, SHA256: sum},
		{Path: images.CRIUSubdir + "/core-1.img", Size: 1 << 30, SHA256: sum},
	}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name, images.ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The restore is lazy by the image's memory pages against LazyAbove,
// always with Lazy, never with a negative LazyAbove, and eager for an
// image whose manifest does not read.
func TestLazyFor(t *testing.T) {
	dir := t.TempDir()
	writeSizedImage(t, dir, imageName(1), 63<<20)
	writeSizedImage(t, dir, imageName(2), 64<<20)
	writeSizedImage(t, dir, imageName(3), 2<<30)
	writeImage(t, dir, imageName(4)) // "{}": not a kcr manifest
	uffd := uffdUsable()
	for _, c := range []struct {
		name  string
		o     Options
		image string
		want  bool
	}{
		{"below the default", Options{}, imageName(1), false},
		{"at the default", Options{}, imageName(2), uffd},
		{"2 GiB", Options{}, imageName(3), uffd},
		{"a higher bound", Options{LazyAbove: 1 << 30}, imageName(2), false},
		{"eager always", Options{LazyAbove: -1}, imageName(3), false},
		{"lazy always", Options{Lazy: true}, imageName(1), true},
		{"lazy always, bad manifest", Options{Lazy: true}, imageName(4), true},
		{"bad manifest", Options{}, imageName(4), false},
		{"no image", Options{}, imageName(5), false},
	} {
		o := c.o
		o.setDefaults()
		b := &engineBackend{o: &o, log: slog.New(slog.DiscardHandler)}
		if got := b.lazyFor(dir, c.image); got != c.want {
			t.Errorf("%s: lazyFor(%s) = %v, want %v (userfaultfd usable: %v)", c.name, c.image, got, c.want, uffd)
		}
		if got := b.restoreOptions(dir, c.image).Lazy; got != c.want {
			t.Errorf("%s: restoreOptions(%s).Lazy = %v, want %v", c.name, c.image, got, c.want)
		}
	}
}

// Where kcr may not create a userfaultfd (no CAP_SYS_PTRACE and
// vm.unprivileged_userfaultfd 0, as in a pod given only the restore's
// capabilities), uffdUsable says so, and lazyFor restores eagerly.
func TestUffdUsableWithoutPtrace(t *testing.T) {
	if os.Getenv("KCR_TEST_UFFD_CHILD") == "1" {
		fmt.Println("uffd usable:", uffdUsable())
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("run as root: the test drops CAP_SYS_PTRACE from a child's capabilities")
	}
	if !uffdUsable() {
		t.Fatal("root with CAP_SYS_PTRACE: userfaultfd refused")
	}
	sysctl, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(sysctl)) == "1"
	cmd := exec.Command("setpriv", "--bounding-set", "-sys_ptrace", os.Args[0], "-test.run", "^TestUffdUsableWithoutPtrace$")
	cmd.Env = append(os.Environ(), "KCR_TEST_UFFD_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("setpriv: %v: %s", err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("uffd usable: %v", want)) {
		t.Fatalf("without CAP_SYS_PTRACE (vm.unprivileged_userfaultfd %s): %s; want uffd usable: %v", strings.TrimSpace(string(sysctl)), out, want)
	}
}
