package e2e

// Signed images: checksums are chosen by whoever wrote
// an image, so only a signature says who that was.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// asOther runs a shell command as uid imagetest.OtherUID, as an attacker on the host
// would, with stdin from in.
func asOther(t *testing.T, in []byte, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: imagetest.OtherUID, Gid: imagetest.OtherUID}}
	cmd.Stdin = bytes.NewReader(in)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as uid %d: %s: %v: %s", imagetest.OtherUID, script, err, out)
	}
}

// sharedDir returns a new directory that uid imagetest.OtherUID owns, under ancestors it
// can traverse.
func sharedDir(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := filepath.Join(base, "drop")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	imagetest.ChownAll(t, d, imagetest.OtherUID)
	return d
}

// reforge rewrites an archive as an attacker who changes a pages file and
// fixes its checksum in the manifest, keeping the original signature.
func reforge(t *testing.T, data []byte) []byte {
	t.Helper()
	ents := imagetest.ReadArchive(t, data)
	if len(ents) < 3 || ents[1].Hdr.Name != "manifest.sig" {
		t.Fatalf("signed archive: second entry is %q, want manifest.sig", ents[1].Hdr.Name)
	}
	var m map[string]any
	if err := json.Unmarshal(ents[0].Data, &m); err != nil {
		t.Fatal(err)
	}
	changed := ""
	for _, e := range ents[2:] {
		if strings.HasPrefix(filepath.Base(e.Hdr.Name), "pages-") && len(e.Data) > 100 {
			e.Data[100] ^= 0xff
			changed = e.Hdr.Name
			sum := sha256.Sum256(e.Data)
			for _, f := range m["files"].([]any) {
				if f := f.(map[string]any); f["path"] == changed {
					f["sha256"] = hex.EncodeToString(sum[:])
				}
			}
			break
		}
	}
	if changed == "" {
		t.Fatal("no pages file in the archive")
	}
	ents[0].Data, _ = json.MarshalIndent(m, "", "  ")
	for i := range ents {
		ents[i].Hdr.Size = int64(len(ents[i].Data))
	}
	return imagetest.Archive(t, ents)
}

// TestSecuritySignedImage: an image checkpointed with --sign and exported
// into a directory another uid can write. That uid's re-checksummed
// archive imports without --verify-key (checksums are no proof), and root
// refuses it with --verify-key (exit 9, nothing left); the genuine archive
// imports and restores with --verify-key. A signed image in a directory of
// that uid is still refused as root without --allow-untrusted, and with it
// the uid's edit to the manifest is caught by the signature.
func TestSecuritySignedImage(t *testing.T) {
	need(t)
	keys := filepath.Join(t.TempDir(), "ops")
	runKCR(t, kcrOpts{must: true}, "keygen", "-o", keys)
	a := startApp(t)
	img := checkpointGone(t, a.pid, "--sign", keys+".key")
	if r := runKCR(t, kcrOpts{must: true}, "inspect", "--verify-key", keys+".pub", img); !strings.Contains(r.stdout, "verified: signed by SHA256:") {
		t.Fatalf("inspect does not report the signature:\n%s", r.stdout)
	}

	drop := sharedDir(t)
	arch := filepath.Join(drop, "img.tar.zst")
	genuine := filepath.Join(t.TempDir(), "img.tar.zst")
	runKCR(t, kcrOpts{must: true}, "export", img, "-o", genuine)
	data, err := os.ReadFile(genuine)
	if err != nil {
		t.Fatal(err)
	}
	asOther(t, reforge(t, data), "cat > "+arch)

	dest := t.TempDir()
	if r := runKCR(t, kcrOpts{log: logAll}, "import", arch, "-o", filepath.Join(dest, "unchecked")); r.code != 0 {
		t.Fatalf("without --verify-key the forged archive should import (its checksums match): exit %d %s", r.code, r.stderr)
	}
	r := runKCR(t, kcrOpts{log: logAll}, "import", "--verify-key", keys+".pub", arch, "-o", filepath.Join(dest, "forged"))
	if r.code != 9 || !strings.Contains(r.stderr, "changed after it was signed") {
		t.Fatalf("import --verify-key of the forged archive: exit %d %q; want exit 9", r.code, r.stderr)
	}
	if _, err := os.Lstat(filepath.Join(dest, "forged")); err == nil {
		t.Fatal("the refused import left an image")
	}
	if r := runKCR(t, kcrOpts{log: logAll}, "restore", "--verify-key", keys+".pub", filepath.Join(dest, "unchecked")); r.code != 9 {
		t.Fatalf("restore --verify-key of the forged image: exit %d %q; want 9", r.code, r.stderr)
	}

	asOther(t, data, "cat > "+arch)
	good := filepath.Join(dest, "good")
	runKCR(t, kcrOpts{must: true}, "import", "--verify-key", keys+".pub", arch, "-o", good)
	pid, _ := restore(t, good, "--verify-key", keys+".pub")
	if !alive(pid) {
		t.Fatal("the signed image was not restored")
	}
	killWait(pid)
	// What CRIU left in the image at the first restore does not count as
	// an unsigned file at the second.
	pid, _ = restore(t, good, "--verify-key", keys+".pub")
	killWait(pid)

	// A signed image the other uid owns: the signature does not replace
	// --allow-untrusted, and catches that uid's edit when allowed.
	theirs := filepath.Join(drop, "img")
	if out, err := exec.Command("cp", "-a", good, theirs).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	imagetest.ChownAll(t, theirs, imagetest.OtherUID)
	if r := runKCR(t, kcrOpts{log: logAll}, "restore", "--verify-key", keys+".pub", theirs); r.code != 5 || !strings.Contains(r.stderr, "--allow-untrusted") {
		t.Fatalf("restore --verify-key of uid %d's image: exit %d %q; want 5 (untrusted owner)", imagetest.OtherUID, r.code, r.stderr)
	}
	asOther(t, nil, `sed -i 's/"leave_running": false/"leave_running": true/' `+filepath.Join(theirs, "manifest.json"))
	if r := runKCR(t, kcrOpts{log: logAll}, "restore", "--verify-key", keys+".pub", "--allow-untrusted", theirs); r.code != 9 {
		t.Fatalf("restore of the edited image: exit %d %q; want 9", r.code, r.stderr)
	}
}
