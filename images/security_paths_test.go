package images

// Root-kcr and paths another uid controls (docs/security-paths.md).

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestSecurityCreateRefusesUntrustedParent (finding 1 of docs/security-paths.md): as root, an image
// is not started in a directory that another uid owns or can write, nor
// below one, nor through a link into one.
func TestSecurityCreateRefusesUntrustedParent(t *testing.T) {
	imagetest.NeedRoot(t)
	base := t.TempDir()
	theirs := filepath.Join(base, "theirs")
	os.Mkdir(theirs, 0o755)
	os.Chown(theirs, imagetest.OtherUID, imagetest.OtherUID)
	below := filepath.Join(theirs, "below")
	os.Mkdir(below, 0o700) // root's, but its parent is not
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	link := filepath.Join(base, "link")
	os.Symlink(below, link)
	sticky := filepath.Join(base, "sticky")
	os.Mkdir(sticky, 0o777)
	os.Chmod(sticky, 0o777|os.ModeSticky)
	for _, dir := range []string{theirs, below, open, link} {
		b, err := Create(filepath.Join(dir, "img"))
		if err == nil {
			b.Abort()
		}
		if !errors.Is(err, ErrUntrusted) {
			t.Errorf("Create in %s: %v, want ErrUntrusted", dir, err)
		}
	}
	b, err := Create(filepath.Join(sticky, "img"))
	if err != nil {
		t.Fatalf("Create in a sticky directory of root's (as /tmp): %v", err)
	}
	b.Abort()
}

// TestBuilderPublishChecksInode: the temporary directory renamed away and
// replaced before Commit is not sealed, signed nor published; and a link
// planted where the Builder writes is not followed.
func TestBuilderPublishChecksInode(t *testing.T) {
	dir := t.TempDir()
	final := filepath.Join(dir, "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	precious := filepath.Join(dir, "precious")
	os.WriteFile(precious, []byte("root's\n"), 0o600)
	os.Symlink(precious, filepath.Join(b.Dir(), "container-spec.json"))
	if err := b.WriteFile("container-spec.json", []byte("spec")); err == nil {
		t.Error("WriteFile over a planted link succeeded")
	}
	if got, _ := os.ReadFile(precious); string(got) != "root's\n" {
		t.Fatalf("written through the link: %q", got)
	}
	os.Remove(filepath.Join(b.Dir(), "container-spec.json"))
	os.WriteFile(filepath.Join(b.CRIUDir(), "pages-1.img"), []byte("mine"), 0o600)
	os.Rename(b.Dir(), filepath.Join(dir, "away"))
	os.MkdirAll(filepath.Join(b.Dir(), "criu"), 0o700)
	os.WriteFile(filepath.Join(b.Dir(), "criu", "pages-1.img"), []byte("swapped in"), 0o600)
	_, err = b.Commit(context.Background(), &Manifest{})
	if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("Commit after the swap: %v, want ErrUntrusted saying it was replaced", err)
	}
	if _, err := os.Stat(final); err == nil {
		t.Error("published after the swap")
	}
}

// asOther runs sh -c script as uid and gid imagetest.OtherUID and waits.
func asOther(t *testing.T, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: imagetest.OtherUID, Gid: imagetest.OtherUID}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as uid %d: %s: %v %s", imagetest.OtherUID, script, err, out)
	}
}

// TestSecurityVerifyKeyringWritable (finding 4 of docs/security-paths.md): root's ops.pub, mode
// 0664 with uid 61001's group, has that user's key appended; an archive
// signed with that key must not then pass import --verify-key ops.pub.
func TestSecurityVerifyKeyringWritable(t *testing.T) {
	imagetest.NeedRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	if _, err := GenerateKeyFiles(filepath.Join(dir, "ops"), "ops"); err != nil {
		t.Fatal(err)
	}
	ring := filepath.Join(dir, "ops.pub")
	os.Chown(ring, 0, imagetest.OtherUID)
	os.Chmod(ring, 0o664)
	attacker := filepath.Join(t.TempDir(), "evil")
	if _, err := GenerateKeyFiles(attacker, "evil"); err != nil {
		t.Fatal(err)
	}
	evilPub, _ := os.ReadFile(attacker + ".pub")
	asOther(t, "printf '%s' '"+string(evilPub)+"' >> "+ring)
	priv, err := LoadPrivateKey(attacker + ".key")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "a"+ArchiveExt)
	if _, _, err := ExportFile(context.Background(), buildSigned(t, priv), archive); err != nil {
		t.Fatal(err)
	}
	keys, err := LoadPublicKeys(ring)
	if err == nil {
		_, err = ImportFile(context.Background(), archive, filepath.Join(t.TempDir(), "img"), WithVerifyKeys(keys))
		t.Errorf("a keyring uid 61001 could write was used (%d keys); the import of its signed archive: %v", len(keys), err)
	} else if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "0664") {
		t.Errorf("keyring of mode 0664: %v; want ErrUntrusted naming the mode", err)
	}
	// Its directory counts too.
	os.Chmod(ring, 0o644)
	os.Chown(dir, imagetest.OtherUID, imagetest.OtherUID)
	if _, err := LoadPublicKeys(ring); !errors.Is(err, ErrUntrusted) {
		t.Errorf("keyring in a directory of uid 61001: %v; want ErrUntrusted", err)
	}
	os.Chown(dir, 0, 0)
	if keys, err := LoadPublicKeys(ring); err != nil || len(keys) != 2 {
		t.Errorf("root's keyring, 0644: %d keys, %v", len(keys), err)
	}
}
