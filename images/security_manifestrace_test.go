package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// init is, with KCR_TEST_EXCHANGE=A:B:SECONDS, uid 61001's swapper: it
// exchanges A and B with renameat2(RENAME_EXCHANGE) as fast as it can.
func init() {
	spec := os.Getenv("KCR_TEST_EXCHANGE")
	if spec == "" {
		return
	}
	f := strings.Split(spec, ":")
	d, _ := time.ParseDuration(f[2])
	for end := time.Now().Add(d); time.Now().Before(end); {
		if err := unix.Renameat2(unix.AT_FDCWD, f[0], unix.AT_FDCWD, f[1], unix.RENAME_EXCHANGE); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// traversable makes dir and its parents up to /tmp searchable by others.
func traversable(dir string) {
	for p := dir; p != "/tmp" && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
}

// swapper starts uid 61001's swapper of a and b for d.
func swapper(t *testing.T, a, b string, d time.Duration) *exec.Cmd {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "images.test")
	traversable(filepath.Dir(bin))
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), fmt.Sprintf("KCR_TEST_EXCHANGE=%s:%s:%s", a, b, d))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: imagetest.OtherUID, Gid: imagetest.OtherUID}}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// bounded runs f, failing the test if it has not returned within 3 s;
// unblock then releases a reader hung on a FIFO.
func bounded(t *testing.T, what string, f func() error, unblock func()) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(3 * time.Second):
		t.Errorf("%s hung (on a FIFO)", what)
		unblock()
		return <-done
	}
}

// release opens the FIFOs named for writing and closes them: a reader
// blocked in open(2) then sees EOF.
func release(names ...string) func() {
	return func() {
		for range 50 {
			for _, n := range names {
				if f, err := os.OpenFile(n, os.O_RDWR|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestSecurityRecoverPendingFIFO (finding 7 of docs/security-paths.md): a FIFO that uid 61001 names
// manifest.pending.json in its checkpoint directory does not hang root's
// kcr recover.
func TestSecurityRecoverPendingFIFO(t *testing.T) {
	imagetest.NeedRoot(t)
	dir := filepath.Join(t.TempDir(), "shared")
	os.Mkdir(dir, 0o755)
	tmp := filepath.Join(dir, ".svc.img.kcr-tmp-1")
	os.MkdirAll(filepath.Join(tmp, "criu"), 0o700)
	os.WriteFile(filepath.Join(tmp, "criu", CRIUDoneName), nil, 0o600)
	fifo := filepath.Join(tmp, PendingName)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	imagetest.ChownAll(t, dir, imagetest.OtherUID)
	bounded(t, "FindPending", func() error { FindPending(dir); return nil }, release(fifo))
	err := bounded(t, "Recover", func() error { _, err := Recover(context.Background(), tmp, nil); return err }, release(fifo))
	if !errors.Is(err, ErrUntrusted) {
		t.Errorf("recover of uid 61001's directory: %v, want ErrUntrusted", err)
	}
}

// TestSecurityReadManifestExchange (finding 7 of docs/security-paths.md): uid 61001 exchanges its
// image's manifest.json with a FIFO, then with a link to a file of root's,
// while root reads the manifest (inspect --no-verify) and opens the image:
// root never hangs, and never shows a byte of that file.
func TestSecurityReadManifestExchange(t *testing.T) {
	imagetest.NeedRoot(t)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("Zroot's secret"), 0o600)
	for _, kind := range []string{"fifo", "link"} {
		t.Run(kind, func(t *testing.T) {
			img := build(t)
			traversable(filepath.Dir(img))
			other := filepath.Join(img, "other")
			if kind == "fifo" {
				syscall.Mkfifo(other, 0o600)
			} else {
				os.Symlink(secret, other)
			}
			imagetest.ChownAll(t, img, imagetest.OtherUID)
			m := filepath.Join(img, ManifestName)
			swapper(t, m, other, 20*time.Second)
			wait.For(t, 5*time.Second, "the swapper to swap", func() bool {
				fi, err := os.Lstat(m)
				return err == nil && !fi.Mode().IsRegular()
			})
			openFailed := false
			for i, end := 0, time.Now().Add(2*time.Second); time.Now().Before(end); i++ {
				err := bounded(t, "ReadManifest", func() error { _, err := ReadManifest(img); return err }, release(m, other))
				if err != nil && strings.Contains(err.Error(), "'Z'") {
					t.Fatalf("read %d: root's file leaked into the error: %v", i, err)
				}
				err = bounded(t, "Open", func() error {
					im, err := OpenWith(context.Background(), img, OpenOptions{Trusted: true})
					if err == nil {
						im.Close()
					}
					return err
				}, release(m, other))
				if !errors.Is(err, ErrUntrusted) && !openFailed {
					openFailed = true // the owner check must come before any read
					t.Errorf("open %d of uid 61001's image: %v, want ErrUntrusted", i, err)
				}
				if t.Failed() && !openFailed {
					return
				}
			}
		})
	}
}
