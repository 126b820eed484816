package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/images"
)

// run executes one kcr subcommand and returns its stdout, its error and
// the exit code kcr would give.
func run(t *testing.T, cmd *cobra.Command, args ...string) (string, error, int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	cmd.SetArgs(args)
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &exitError{exitUsage, err} })
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err = cmd.ExecuteContext(context.Background())
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	code := 0
	if err != nil {
		code = exitCode(err)
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("error spans lines: %q", err)
		}
	}
	return string(out), err, code
}

// writeImage writes a small image with manifest m, signed by the key file
// priv unless it is "".
func writeImage(t *testing.T, m *images.Manifest, priv string) string {
	t.Helper()
	final := filepath.Join(t.TempDir(), "img")
	b, err := images.Create(final)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	if err := os.WriteFile(filepath.Join(b.CRIUDir(), "inventory.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if priv != "" {
		k, err := images.LoadPrivateKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		b.SignWith(k)
	}
	if _, err := b.Commit(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return final
}

// signedImage writes a small image signed by the key file priv.
func signedImage(t *testing.T, priv string) string {
	t.Helper()
	return writeImage(t, &images.Manifest{Created: time.Now(), Process: images.Process{PID: 7, Comm: "app"}}, priv)
}

func keygen(t *testing.T) string {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "ops")
	if _, err, code := run(t, keygenCmd(&globals{}), "-o", prefix); err != nil {
		t.Fatalf("keygen: exit %d: %v", code, err)
	}
	return prefix
}

func TestKeygenCmd(t *testing.T) {
	prefix := keygen(t)
	for _, f := range []string{prefix + ".key", prefix + ".pub"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err, code := run(t, keygenCmd(&globals{}), "-o", prefix); err == nil || code == 0 || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Errorf("keygen over existing keys: exit %d %v", code, err)
	}
	if _, _, code := run(t, keygenCmd(&globals{})); code != exitUsage {
		t.Errorf("keygen without -o: exit %d, want %d", code, exitUsage)
	}
}

// TestVerifyKeyCmds: inspect, import and restore with --verify-key accept
// an image signed by the key and refuse, with exit 9, one that is unsigned
// or signed by another key, before CRIU is involved.
func TestVerifyKeyCmds(t *testing.T) {
	ours, theirs := keygen(t), keygen(t)
	img := signedImage(t, ours+".key")
	unsigned := signedImage(t, "")
	foreign := signedImage(t, theirs+".key")

	out, err, code := run(t, inspectCmd(&globals{}), "--verify-key", ours+".pub", img)
	if err != nil || !strings.Contains(out, "verified: signed by SHA256:") {
		t.Fatalf("inspect of a signed image: exit %d %v\n%s", code, err, out)
	}
	if out, _, _ := run(t, inspectCmd(&globals{}), img); !strings.Contains(out, "present, not checked") {
		t.Errorf("inspect without --verify-key does not mention the signature:\n%s", out)
	}
	for name, dir := range map[string]string{"unsigned": unsigned, "another key's": foreign} {
		if _, err, code := run(t, inspectCmd(&globals{}), "--verify-key", ours+".pub", dir); code != exitSignature {
			t.Errorf("inspect of an %s image: exit %d %v, want %d", name, code, err, exitSignature)
		}
		_, err, code := run(t, restoreCmd(&globals{criu: "/nonexistent/criu"}), "--verify-key", ours+".pub", dir)
		if code != exitSignature {
			t.Errorf("restore of an %s image: exit %d %v, want %d", name, code, err, exitSignature)
		}
	}
	// Several key files, one of them ours.
	if _, err, _ := run(t, inspectCmd(&globals{}), "--verify-key", theirs+".pub", "--verify-key", ours+".pub", foreign); err != nil {
		t.Errorf("inspect with two keys: %v", err)
	}
	if _, _, code := run(t, inspectCmd(&globals{}), "--no-verify", "--verify-key", ours+".pub", img); code != exitUsage {
		t.Errorf("--no-verify --verify-key: exit %d, want %d", code, exitUsage)
	}
	if _, _, code := run(t, inspectCmd(&globals{}), "--verify-key", ours+".key", img); code != exitUsage {
		t.Errorf("--verify-key with the private key: exit %d, want %d", code, exitUsage)
	}

	// The archive keeps the signature; import verifies it.
	dir := t.TempDir()
	arch := filepath.Join(dir, "img.tar.zst")
	if _, err, code := run(t, exportCmd(&globals{}), "-o", arch, img); err != nil {
		t.Fatalf("export: exit %d %v", code, err)
	}
	if _, err, code := run(t, importCmd(&globals{}), "--verify-key", theirs+".pub", "-o", filepath.Join(dir, "x"), arch); code != exitSignature {
		t.Errorf("import with another key: exit %d %v, want %d", code, err, exitSignature)
	}
	if _, err := os.Lstat(filepath.Join(dir, "x")); err == nil {
		t.Error("a refused import left an image")
	}
	if _, err, code := run(t, importCmd(&globals{}), "--verify-key", ours+".pub", "-o", filepath.Join(dir, "y"), arch); err != nil {
		t.Fatalf("import: exit %d %v", code, err)
	}
	if _, err, _ := run(t, inspectCmd(&globals{}), "--verify-key", ours+".pub", filepath.Join(dir, "y")); err != nil {
		t.Errorf("imported image: %v", err)
	}
}

// TestSignKeyRefusedFirst: a bad --sign key is refused with a usage error
// before the target is asked anything.
func TestSignKeyRefusedFirst(t *testing.T) {
	prefix := keygen(t)
	os.Chmod(prefix+".key", 0o644)
	_, err, code := run(t, checkpointCmd(&globals{}), "--sign", prefix+".key", "-o", filepath.Join(t.TempDir(), "img"), strconv.Itoa(os.Getpid()))
	if code != exitUsage || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("checkpoint --sign with a readable key: exit %d %v", code, err)
	}
	_, err, code = run(t, recoverCmd(&globals{}), "--sign", prefix+".pub", t.TempDir())
	if code != exitUsage {
		t.Errorf("recover --sign with a public key: exit %d %v", code, err)
	}
	if !bytes.Contains([]byte(err.Error()), []byte("--sign")) {
		t.Errorf("error does not name --sign: %v", err)
	}
}

// TestRunNegativeReadyTimeout: kcr run --ready-timeout -1s is refused, not
// taken as "do not wait", and nothing is started.
func TestRunNegativeReadyTimeout(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "started")
	_, err, code := run(t, runCmd(&globals{}), "--ready-timeout", "-1s", "--log", filepath.Join(t.TempDir(), "log"), "--", "touch", marker)
	if code != exitUsage || !strings.Contains(err.Error(), "negative") {
		t.Errorf("exit %d %v, want %d saying it is negative", code, err, exitUsage)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Error("the program was started")
	}
}
