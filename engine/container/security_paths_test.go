package container

// Root-kcr against a second uid (docs/security-paths.md). Each test keeps the
// shape of the attack that the review reproduced.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest/containerimg"
)

// fakeRunc writes a runtime that reports a running container (pid, bundle)
// and whose checkpoint takes a while, as a slow runtime's does, then writes
// CRIU's files into --image-path.
func fakeRunc(t *testing.T, pid int, bundle string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runc")
	script := `#!/bin/sh
for a; do case "$a" in
state) echo '{"id":"c","pid":` + strconv.Itoa(pid) + `,"status":"running","bundle":"` + bundle + `"}'; exit 0;;
checkpoint) cp=1;;
esac; done
if [ -n "$cp" ]; then
  while [ "$1" != --image-path ]; do shift; done
  sleep 1.5
  echo dumped > "$2/inventory.img"; echo done > "$2/stats-dump"; exit 0
fi
exit 1
`
	if err := os.WriteFile(p, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSecurityCheckpointSignSwappedTmp (finding 1 of docs/security-paths.md): uid 61001 owns the
// directory the image goes to and swaps kcr's temporary directory for its
// own while the slow runtime dumps. Root must not seal, sign and publish
// that user's directory: the output is refused before anything runs.
func TestSecurityCheckpointSignSwappedTmp(t *testing.T) {
	imagetest.NeedRoot(t)
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	bundle := t.TempDir()
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"root":{"path":"rootfs"}}`), 0o600)
	precious := filepath.Join(t.TempDir(), "precious")
	os.WriteFile(precious, []byte("root's\n"), 0o600)

	for _, c := range []struct{ shape, link string }{
		{"owned by 61001", ""}, {"root's, mode 0777", ""},
		{"owned by 61001", ` && ln -s ` + precious + ` "$d/container-spec.json"`},
	} {
		shape := c.shape
		t.Run(shape+map[bool]string{true: ", spec link"}[c.link != ""], func(t *testing.T) {
			base := t.TempDir()
			os.Chmod(base, 0o755)
			os.Chmod(filepath.Dir(base), 0o755) // t.TempDir's own parent is 0700
			shared := filepath.Join(base, "shared")
			os.Mkdir(shared, 0o755)
			if shape == "owned by 61001" {
				os.Chown(shared, imagetest.OtherUID, imagetest.OtherUID)
			} else {
				os.Chmod(shared, 0o777)
			}
			// The attacker's swap: its own directory, with its own "dump"
			// and a link where kcr writes the container's spec.
			imagetest.AsOther(t, `cd `+shared+` || exit 1
while :; do for d in .svc.img.kcr-tmp-*; do
  if [ -d "$d" ]; then mv "$d" stolen && mkdir -p "$d/criu" && echo evil > "$d/criu/pages-1.img"`+c.link+`; exit 0; fi
done; sleep 0.01; done`)
			time.Sleep(100 * time.Millisecond)
			key := testKey(t)
			out := filepath.Join(shared, "svc.img")
			_, err := CheckpointContainer(context.Background(), CheckpointOptions{Target: Target{ID: "c", Runtime: fakeRunc(t, sleep.Process.Pid, bundle)}, Output: out, SignKey: key})
			if !errors.Is(err, images.ErrUntrusted) || !strings.Contains(err.Error(), shared) {
				t.Errorf("checkpoint --sign into a directory %s: %v; want ErrUntrusted naming %s", shape, err, shared)
			}
			if _, err := os.Stat(filepath.Join(out, images.ManifestName)); err == nil {
				b, _ := os.ReadFile(filepath.Join(out, "criu", "pages-1.img"))
				t.Errorf("an image was published (and signed) there; its pages-1.img: %q", b)
			}
			if b, _ := os.ReadFile(precious); string(b) != "root's\n" {
				t.Errorf("root wrote the container's spec through the attacker's link: %q", b)
			}
		})
	}
}

// testKey makes a signing key.
func testKey(t *testing.T) []byte {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "k")
	if _, err := images.GenerateKeyFiles(prefix, ""); err != nil {
		t.Fatal(err)
	}
	key, err := images.LoadPrivateKey(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// exportedContainer writes a signed-less container image whose spec runs
// a createRuntime hook, and exports it as a CRI-O archive and an OCI
// layout into dir; it returns the image, the archive and the layout.
func exportedContainer(t *testing.T, dir string) (string, string, string) {
	t.Helper()
	img := containerimg.Write(t, containerimg.Options{Bundle: "/", Files: map[string]string{
		containerSpecFile: `{"root":{"path":"/"},"hooks":{"createRuntime":[{"path":"/bin/sh","args":["sh","-c","id > /tmp/pwned"]}]}}`,
	}})
	archive, layout := filepath.Join(dir, "c.tar"), filepath.Join(dir, "layout")
	for f, out := range map[string]string{FormatCRIO: archive, FormatOCI: layout} {
		if _, err := Export(context.Background(), ExportOptions{Image: img, Format: f, Output: out}); err != nil {
			t.Fatal(err)
		}
	}
	return img, archive, layout
}

// TestSecurityRestoreThroughLink (finding 2 of docs/security-paths.md): a link of root's, in a
// directory of root's, to uid 61001's archive or OCI layout, or to an image
// of root's inside 61001's directory, is resolved and the resolved path
// checked: runc is never handed what that user wrote, or can swap.
func TestSecurityRestoreThroughLink(t *testing.T) {
	imagetest.NeedRoot(t)
	theirs := filepath.Join(t.TempDir(), "theirs")
	os.Mkdir(theirs, 0o755)
	img, archive, layout := exportedContainer(t, theirs)
	imagetest.ChownAll(t, theirs, imagetest.OtherUID)
	inTheirs := filepath.Join(theirs, "img") // root's image, their directory
	if err := os.Rename(img, inTheirs); err != nil {
		t.Fatal(err)
	}
	links := t.TempDir()
	ran := filepath.Join(t.TempDir(), "ran")
	runtime := filepath.Join(t.TempDir(), "runc")
	os.WriteFile(runtime, []byte("#!/bin/sh\necho \"$@\" >> "+ran+"\nexit 1\n"), 0o700)
	for name, target := range map[string]string{"archive": archive, "layout": layout, "image": inTheirs} {
		link := filepath.Join(links, name)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		_, err := RestoreContainer(context.Background(), RestoreOptions{Target: Target{ID: "c", Runtime: runtime}, Image: link})
		if !errors.Is(err, images.ErrUntrusted) || !strings.Contains(err.Error(), "61001") {
			t.Errorf("restore --container of a link to uid 61001's %s: %v; want ErrUntrusted naming uid 61001", name, err)
		}
		if b, err := os.ReadFile(ran); err == nil {
			t.Errorf("%s: runc was run: %s", name, b)
			os.Remove(ran)
		}
	}
}

// TestSecurityExportUserImage (finding 3 of docs/security-paths.md): uid 61001's image names, in
// its container.json, a root-only directory as its bundle, whose
// config.json is a credential. Root's export must not copy that file into
// the archive (as spec.dump) nor turn the user's image into a root-owned
// archive: it refuses the image.
func TestSecurityExportUserImage(t *testing.T) {
	imagetest.NeedRoot(t)
	secret := filepath.Join(t.TempDir(), "docker")
	os.Mkdir(secret, 0o700)
	os.WriteFile(filepath.Join(secret, "config.json"), []byte(`{"auths":{"registry":{"auth":"c2VjcmV0"}}}`), 0o600)
	theirs := filepath.Join(t.TempDir(), "theirs")
	os.Mkdir(theirs, 0o755)
	img := containerimg.Write(t, containerimg.Options{Dir: filepath.Join(theirs, "img"), Bundle: secret})
	imagetest.ChownAll(t, theirs, imagetest.OtherUID)
	for _, format := range []string{FormatCRIO, FormatOCI, FormatKCR} {
		out := filepath.Join(t.TempDir(), "out")
		_, err := Export(context.Background(), ExportOptions{Image: img, Format: format, Output: out})
		if !errors.Is(err, images.ErrUntrusted) || !strings.Contains(err.Error(), "61001") {
			t.Errorf("export --format %s of uid 61001's image: %v; want ErrUntrusted naming uid 61001", format, err)
		}
		found := false
		filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				data, _ := os.ReadFile(p)
				found = found || strings.Contains(string(data), "c2VjcmV0") || strings.Contains(string(data), "registry")
			}
			return nil
		})
		if found {
			t.Errorf("export --format %s: root's credential is in the output", format)
		}
	}
}

// TestExportOCIPrivate: every directory of the OCI layout is 0700 and
// every file 0600, like the memory blob.
func TestExportOCIPrivate(t *testing.T) {
	img := containerimg.Write(t, containerimg.Options{})
	out := filepath.Join(t.TempDir(), "oci")
	if _, err := Export(context.Background(), ExportOptions{Image: img, Format: FormatOCI, Output: out}); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]os.FileMode{true: 0o700, false: 0o600}[fi.IsDir()]; fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", p, fi.Mode().Perm(), want)
		}
		return nil
	})
}

// TestSecurityContainerOutputParentLink (finding 5 of docs/security-paths.md): restore --container
// --container-output U/logs/secret.txt neither truncates nor writes root's
// file through uid 61001's link; and an output that is a link is refused.
func TestSecurityContainerOutputParentLink(t *testing.T) {
	imagetest.NeedRoot(t)
	u, secret := imagetest.LinkedDir(t)
	img := containerimg.Write(t, containerimg.Options{})
	ran := filepath.Join(t.TempDir(), "ran")
	runtime := filepath.Join(t.TempDir(), "runc")
	os.WriteFile(runtime, []byte("#!/bin/sh\necho \"$@\" >> "+ran+"\necho output; exit 1\n"), 0o700)
	_, err := RestoreContainer(context.Background(), RestoreOptions{Target: Target{ID: "c", Runtime: runtime}, Image: img, Stdout: filepath.Join(u, "logs", "secret.txt")})
	if !errors.Is(err, images.ErrUntrusted) || !strings.Contains(err.Error(), "61001") {
		t.Errorf("restore --container-output through uid 61001's link: %v; want ErrUntrusted naming uid 61001", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root's\n" {
		t.Errorf("root's file was truncated or written through the link: %q", b)
	}
	// An existing output of root's is appended to, not truncated.
	own := filepath.Join(t.TempDir(), "out.log")
	os.WriteFile(own, []byte("before\n"), 0o600)
	RestoreContainer(context.Background(), RestoreOptions{Target: Target{ID: "c", Runtime: runtime}, Image: img, Stdout: own})
	if b, _ := os.ReadFile(own); !strings.HasPrefix(string(b), "before\n") {
		t.Errorf("the existing output was truncated: %q", b)
	}
}

// TestSecurityCRIUConfigAnnotation: the CRIU configuration
// a container's org.criu.config annotation names is read as root only if
// no other user could have written it, bounded, and never from a FIFO.
func TestSecurityCRIUConfigAnnotation(t *testing.T) {
	imagetest.NeedRoot(t)
	dir := t.TempDir()
	theirs := filepath.Join(dir, "theirs.conf")
	os.WriteFile(theirs, []byte("action-script /tmp/evil\n"), 0o644)
	os.Chown(theirs, imagetest.OtherUID, imagetest.OtherUID)
	fifo := filepath.Join(dir, "fifo.conf")
	syscall.Mkfifo(fifo, 0o600)
	own := filepath.Join(dir, "own.conf")
	os.WriteFile(own, []byte("action-script /usr/local/bin/kcr-criu-hook\n"), 0o644)
	for conf, want := range map[string]bool{theirs: false, fifo: false, own: true} {
		done := make(chan bool, 1)
		go func() {
			_, ok := criuConfigHasHook(&ContainerState{Annotations: map[string]string{"org.criu.config": conf}})
			done <- ok
		}()
		select {
		case ok := <-done:
			if ok != want {
				t.Errorf("%s: has hook %v, want %v", filepath.Base(conf), ok, want)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("%s: reading it hung", filepath.Base(conf))
			if f, err := os.OpenFile(fifo, os.O_RDWR, 0); err == nil {
				f.Close()
			}
		}
	}
}
