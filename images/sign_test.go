package images

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// testKey writes a key pair into a temporary directory and returns the
// private key and the public key file.
func testKey(t *testing.T) (ed25519.PrivateKey, string) {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "signer")
	if _, err := GenerateKeyFiles(prefix, "test key"); err != nil {
		t.Fatal(err)
	}
	priv, err := LoadPrivateKey(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	return priv, prefix + ".pub"
}

func pubKeys(t *testing.T, files ...string) []ed25519.PublicKey {
	t.Helper()
	keys, err := LoadPublicKeys(files...)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// buildSigned commits a complete image signed by priv, if not nil.
func buildSigned(t *testing.T, priv ed25519.PrivateKey) string {
	t.Helper()
	final := filepath.Join(t.TempDir(), "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	writeDump(t, b.CRIUDir())
	b.SignWith(priv)
	if _, err := b.Commit(context.Background(), testManifest()); err != nil {
		t.Fatal(err)
	}
	return final
}

func openSigned(dir string, keys []ed25519.PublicKey) error {
	im, err := OpenWith(context.Background(), dir, OpenOptions{VerifyKeys: keys})
	if err == nil {
		im.Close()
	}
	return err
}

func TestKeygen(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "k")
	pub, err := GenerateKeyFiles(prefix, "ops@example")
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, prefix+".key"); m != 0o600 {
		t.Errorf("private key mode %04o, want 0600", m)
	}
	if m := mode(t, prefix+".pub"); m != 0o644 {
		t.Errorf("public key mode %04o, want 0644", m)
	}
	keys := pubKeys(t, prefix+".pub")
	if len(keys) != 1 || !keys[0].Equal(pub) {
		t.Fatalf("public key file holds %v, want %v", keys, pub)
	}
	priv, err := LoadPrivateKey(prefix + ".key")
	if err != nil || !priv.Public().(ed25519.PublicKey).Equal(pub) {
		t.Fatalf("private key does not match: %v", err)
	}
	before, _ := os.ReadFile(prefix + ".key")
	_, err = GenerateKeyFiles(prefix, "")
	if err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("second keygen: %v, want a refusal", err)
	}
	if after, _ := os.ReadFile(prefix + ".key"); !bytes.Equal(before, after) {
		t.Fatal("second keygen changed the private key")
	}
	// Only the public file in the way: nothing is written either.
	p2 := filepath.Join(t.TempDir(), "k")
	os.WriteFile(p2+".pub", nil, 0o644)
	if _, err := GenerateKeyFiles(p2, ""); err == nil {
		t.Fatal("keygen over an existing .pub succeeded")
	}
	if _, err := os.Lstat(p2 + ".key"); err == nil {
		t.Fatal("refused keygen left a .key behind")
	}
}

func TestKeyFilesRefused(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "k")
	if _, err := GenerateKeyFiles(prefix, ""); err != nil {
		t.Fatal(err)
	}
	os.Chmod(prefix+".key", 0o640)
	if _, err := LoadPrivateKey(prefix + ".key"); !errors.Is(err, ErrKeyFile) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("group-readable private key: %v", err)
	}
	os.Chmod(prefix+".key", 0o600)
	if _, err := LoadPublicKeys(prefix + ".key"); !errors.Is(err, ErrKeyFile) || !strings.Contains(err.Error(), "private key") {
		t.Errorf("private key as public: %v", err)
	}
	if _, err := LoadPrivateKey(prefix + ".pub"); !errors.Is(err, ErrKeyFile) {
		t.Errorf("public key as private: %v", err) // also mode 0644
	}
	for name, text := range map[string]string{
		"empty":      "# nothing\n\n",
		"short key":  "kcr-ed25519-public-key AAAA\n",
		"not base64": "kcr-ed25519-public-key !!!\n",
		"other tag":  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk\n",
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		os.WriteFile(p, []byte(text), 0o644)
		if _, err := LoadPublicKeys(p); !errors.Is(err, ErrKeyFile) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one-line ErrKeyFile", name, err)
		}
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	priv, pubFile := testKey(t)
	_, otherPub := testKey(t)
	img := buildSigned(t, priv)
	if m := mode(t, filepath.Join(img, SignatureName)); m != 0o600 {
		t.Errorf("signature mode %04o, want 0600", m)
	}
	im, err := OpenWith(context.Background(), img, OpenOptions{VerifyKeys: pubKeys(t, pubFile)})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if !im.Signer.Equal(priv.Public()) {
		t.Errorf("Signer = %v, want the signing key", im.Signer)
	}
	for _, x := range im.Extra {
		if x == SignatureName {
			t.Error("the signature is reported as an extra file")
		}
	}
	// A keyring: any of its keys will do, in several files or one.
	if err := openSigned(img, pubKeys(t, otherPub, pubFile)); err != nil {
		t.Errorf("two key files: %v", err)
	}
	ring := filepath.Join(t.TempDir(), "ring.pub")
	a, _ := os.ReadFile(otherPub)
	b, _ := os.ReadFile(pubFile)
	os.WriteFile(ring, append(append([]byte("# ops keys\n"), a...), b...), 0o644)
	if err := openSigned(img, pubKeys(t, ring)); err != nil {
		t.Errorf("keyring file: %v", err)
	}
	// Without keys a signed image opens as any other.
	if im, err := Open(context.Background(), img); err != nil {
		t.Errorf("Open without keys: %v", err)
	} else if im.Signer != nil {
		t.Error("Signer set though no key was asked for")
	}
}

func TestVerifyRefuses(t *testing.T) {
	priv, pubFile := testKey(t)
	otherPriv, otherPub := testKey(t)
	keys := pubKeys(t, pubFile)
	sigPath := func(img string) string { return filepath.Join(img, SignatureName) }

	for name, tc := range map[string]struct {
		spoil func(t *testing.T, img string)
		kind  error
		frag  string
	}{
		"unsigned": {func(t *testing.T, img string) { must(t, os.Remove(sigPath(img))) }, ErrSignature, "missing"},
		"truncated signature": {func(t *testing.T, img string) {
			b, _ := os.ReadFile(sigPath(img))
			must(t, os.WriteFile(sigPath(img), b[:len(b)-10], 0o600))
		}, ErrSignature, "malformed"},
		"empty signature": {func(t *testing.T, img string) { must(t, os.WriteFile(sigPath(img), nil, 0o600)) }, ErrSignature, "malformed"},
		"signature a symlink": {func(t *testing.T, img string) {
			b, _ := os.ReadFile(sigPath(img))
			must(t, os.WriteFile(filepath.Join(img, "criu", "sig"), b, 0o600))
			os.Remove(sigPath(img))
			must(t, os.Symlink("criu/sig", sigPath(img)))
		}, ErrSignature, "cannot be read"},
		"flipped signature bit": {func(t *testing.T, img string) {
			b, _ := os.ReadFile(sigPath(img))
			f := strings.Fields(string(b))
			s, err := base64.StdEncoding.DecodeString(f[3])
			must(t, err)
			s[5] ^= 1
			f[3] = base64.StdEncoding.EncodeToString(s)
			must(t, os.WriteFile(sigPath(img), []byte(strings.Join(f, " ")+"\n"), 0o600))
		}, ErrSignature, "does not match"},
		"tampered manifest": {func(t *testing.T, img string) {
			editManifest(t, img, func(m map[string]any) { m["host"] = "evil" })
		}, ErrSignature, "changed after it was signed"},
		"tampered file, manifest rehashed": {func(t *testing.T, img string) {
			p := filepath.Join(img, "criu", "core-1.img")
			must(t, os.WriteFile(p, []byte("evil image"), 0o600))
			rehash(t, img, "criu/core-1.img", []byte("evil image"))
		}, ErrSignature, "changed after it was signed"},
		"tampered file": {func(t *testing.T, img string) {
			must(t, os.WriteFile(filepath.Join(img, "criu", "core-1.img"), []byte("evil image"), 0o600))
		}, ErrCorrupt, "sha256 mismatch"},
		"signed by another key": {func(t *testing.T, img string) {
			raw, _ := os.ReadFile(filepath.Join(img, ManifestName))
			must(t, os.WriteFile(sigPath(img), signManifest(otherPriv, raw), 0o600))
		}, ErrSignature, "not one of the --verify-key keys"},
	} {
		t.Run(name, func(t *testing.T) {
			img := buildSigned(t, priv)
			if err := openSigned(img, keys); err != nil {
				t.Fatalf("before spoiling: %v", err)
			}
			tc.spoil(t, img)
			checkErr(t, openSigned(img, keys), tc.kind, tc.frag)
		})
	}
	// The other key's own image verifies with its key, not with ours.
	img := buildSigned(t, otherPriv)
	if err := openSigned(img, pubKeys(t, otherPub)); err != nil {
		t.Fatal(err)
	}
	checkErr(t, openSigned(img, keys), ErrSignature, Fingerprint(otherPriv.Public().(ed25519.PublicKey)))
}

// rehash rewrites the manifest entry of p for new content, as an attacker
// who edits a file and its checksum would.
func rehash(t *testing.T, img, p string, data []byte) {
	t.Helper()
	sum := sha256.Sum256(data)
	editManifest(t, img, func(m map[string]any) {
		for _, f := range m["files"].([]any) {
			e := f.(map[string]any)
			if e["path"] == p {
				e["size"] = float64(len(data))
				e["sha256"] = hex.EncodeToString(sum[:])
			}
		}
	})
}

// TestRecoverSigns: an image recovered with a signer is published signed,
// both when the manifest had still to be written and when only the rename
// was left.
func TestRecoverSigns(t *testing.T) {
	priv, pubFile := testKey(t)
	keys := pubKeys(t, pubFile)
	ctx := context.Background()

	b := pendingDump(t)
	img, err := Recover(ctx, b.Dir(), priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := openSigned(img.Dir, keys); err != nil {
		t.Errorf("recovered from the draft: %v", err)
	}

	final := filepath.Join(t.TempDir(), "img")
	b, err = Create(final)
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	files, _, err := b.seal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := testManifest()
	m.Format, m.FormatVersion, m.Files = Format, FormatVersion, files
	must(t, b.writeManifest(m))
	img, err = Recover(ctx, b.Dir(), priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := openSigned(img.Dir, keys); err != nil {
		t.Errorf("recovered after the manifest: %v", err)
	}
}

// TestSignatureReserved: a manifest cannot list the signature as an image
// file.
func TestSignatureReserved(t *testing.T) {
	img := build(t)
	editManifest(t, img, setFirstPath(SignatureName))
	_, err := Open(context.Background(), img)
	checkErr(t, err, ErrUnsafePath, "reserves")
}

func TestSignedExportImport(t *testing.T) {
	priv, pubFile := testKey(t)
	otherPriv, _ := testKey(t)
	keys := pubKeys(t, pubFile)
	ctx := context.Background()
	img := buildSigned(t, priv)
	data := exportBytes(t, img)
	ents := imagetest.ReadArchive(t, data)
	if len(ents) < 2 || ents[1].Hdr.Name != SignatureName {
		t.Fatalf("the signature is not the archive's second entry")
	}

	// With keys: verified, and the imported image carries the signature.
	dst := filepath.Join(t.TempDir(), "img")
	im, err := Import(ctx, bytes.NewReader(data), dst, WithVerifyKeys(keys))
	if err != nil {
		t.Fatal(err)
	}
	if !im.Signer.Equal(priv.Public()) {
		t.Error("Import did not report the signer")
	}
	if err := openSigned(dst, keys); err != nil {
		t.Errorf("imported image: %v", err)
	}
	// Without keys the signature is kept for a later check.
	dst2 := filepath.Join(t.TempDir(), "img")
	if _, err := Import(ctx, bytes.NewReader(data), dst2); err != nil {
		t.Fatal(err)
	}
	if err := openSigned(dst2, keys); err != nil {
		t.Errorf("imported without keys, verified later: %v", err)
	}

	// Refused before anything is unpacked, leaving nothing behind.
	var m map[string]any
	must(t, json.Unmarshal(ents[0].Data, &m))
	m["host"] = "evil"
	evil, _ := json.Marshal(m)
	for name, tc := range map[string]struct {
		entries []entry
		frag    string
	}{
		"unsigned":             {append([]entry{ents[0]}, ents[2:]...), "missing"},
		"unsigned and empty":   {[]entry{ents[0]}, "missing"},
		"tampered manifest":    {append([]entry{regEntry(ManifestName, evil), ents[1]}, ents[2:]...), "changed after it was signed"},
		"other key":            {append([]entry{ents[0], regEntry(SignatureName, signManifest(otherPriv, ents[0].Data))}, ents[2:]...), "not one of"},
		"truncated signature":  {append([]entry{ents[0], regEntry(SignatureName, ents[1].Data[:40])}, ents[2:]...), "malformed"},
		"signature not second": {append(append([]entry{ents[0]}, ents[2:]...), ents[1]), "missing"},
	} {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			_, err := Import(ctx, bytes.NewReader(imagetest.Archive(t, tc.entries)), filepath.Join(parent, "img"), WithVerifyKeys(keys))
			checkErr(t, err, ErrSignature, tc.frag)
			nothingLeft(t, parent)
		})
	}
}

// TestSecurityForeignCacheIgnored: as root, a verification cache in an
// image of another uid is not believed: that uid could change a file and
// write a cache entry that matches the changed file, so that the signed
// manifest's checksum would never be compared.
func TestSecurityForeignCacheIgnored(t *testing.T) {
	imagetest.NeedRoot(t)
	noQuiet(t)
	priv, pubFile := testKey(t)
	img := buildSigned(t, priv)
	imagetest.ChownAll(t, img, imagetest.OtherUID)
	p := filepath.Join(img, "criu", "core-1.img")
	must(t, os.WriteFile(p, []byte("evil image"), 0o600)) // same size
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]fileID{}
	for _, f := range m.Files {
		q := filepath.Join(img, filepath.FromSlash(f.Path))
		sfi, _ := os.Lstat(q)
		ids[f.Path], _ = idOf(sfi, f.SHA256)
	}
	ids["criu/core-1.img"], _ = idOf(fi, ids["criu/core-1.img"].SHA)
	forged, _ := json.Marshal(ids)
	must(t, os.WriteFile(filepath.Join(img, VerifiedName), forged, 0o600))
	must(t, os.Lchown(filepath.Join(img, VerifiedName), imagetest.OtherUID, imagetest.OtherUID)) // ChownAll would move the files' ctimes
	err = openSigned(img, pubKeys(t, pubFile))
	checkErr(t, err, ErrCorrupt, "core-1.img")
}

// TestOpenListedRechecks: a listed file read through the verified image is
// checked again as it is read, so a change after Open is refused.
func TestOpenListedRechecks(t *testing.T) {
	img := build(t)
	im, err := Open(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	var e FileEntry
	for _, f := range im.Manifest.Files {
		if f.Path == "criu/pages-1.img" {
			e = f
		}
	}
	read := func() error {
		r, err := im.OpenListed(e)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(io.Discard, r)
		return err
	}
	if err := read(); err != nil {
		t.Fatalf("unchanged file: %v", err)
	}
	p := filepath.Join(img, "criu", "pages-1.img")
	b, _ := os.ReadFile(p)
	b[10] ^= 1
	must(t, os.WriteFile(p, b, 0o600))
	checkErr(t, read(), ErrCorrupt, "sha256 mismatch")
	must(t, os.WriteFile(p, append(b, 1), 0o600))
	checkErr(t, read(), ErrCorrupt, "pages-1.img")
	must(t, os.WriteFile(p, b[:100], 0o600))
	checkErr(t, read(), ErrTruncated, "pages-1.img")
	must(t, os.Remove(p))
	must(t, os.Symlink("pages-2.img", p))
	checkErr(t, read(), ErrCorrupt, "symlink")
}

// TestVerifyRefusesUnlistedCRIUFiles: with keys, a file in criu/ that the
// signed manifest does not list is refused (CRIU opens optional images if
// they exist), except the stats CRIU writes at restore; without keys it is
// only reported.
func TestVerifyRefusesUnlistedCRIUFiles(t *testing.T) {
	priv, pubFile := testKey(t)
	keys := pubKeys(t, pubFile)
	img := buildSigned(t, priv)
	must(t, os.WriteFile(filepath.Join(img, "criu", "stats-restore"), []byte{1}, 0o600))
	must(t, os.WriteFile(filepath.Join(img, "extra-note"), []byte{1}, 0o600))
	if err := openSigned(img, keys); err != nil {
		t.Fatalf("CRIU's stats-restore and a file outside criu/: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(img, "criu", "seccomp.img"), []byte("evil"), 0o600))
	checkErr(t, openSigned(img, keys), ErrSignature, "criu/seccomp.img is not listed in the signed manifest.json")
	im, err := Open(context.Background(), img)
	if err != nil {
		t.Fatalf("without keys: %v", err)
	}
	im.Close()
}

// FuzzVerifySignature: no signature file verifies any manifest but the
// one that was signed.
func FuzzVerifySignature(f *testing.F) {
	_, priv, _ := ed25519.GenerateKey(nil)
	manifest := []byte(`{"format":"kcr-image"}` + "\n")
	good := signManifest(priv, manifest)
	keys := []ed25519.PublicKey{priv.Public().(ed25519.PublicKey)}
	f.Add(manifest, good)
	f.Add(manifest, []byte("kcr-signature-v1 ed25519 AAAA AAAA\n"))
	f.Add([]byte("{}"), good)
	f.Fuzz(func(t *testing.T, m, sig []byte) {
		if _, err := verifySignature("x", m, sig, keys); err == nil && !bytes.Equal(m, manifest) {
			t.Fatalf("signature %q verified manifest %q", sig, m)
		}
	})
}

// BenchmarkVerifySignature: the cost --verify-key adds to an Open, for a
// manifest of 64 KiB (some 400 files).
func BenchmarkVerifySignature(b *testing.B) {
	_, priv, _ := ed25519.GenerateKey(nil)
	manifest := bytes.Repeat([]byte("x"), 64<<10)
	sig := signManifest(priv, manifest)
	keys := []ed25519.PublicKey{priv.Public().(ed25519.PublicKey)}
	for b.Loop() {
		if _, err := verifySignature("x", manifest, sig, keys); err != nil {
			b.Fatal(err)
		}
	}
}
