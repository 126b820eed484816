package container

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// containerImage writes a small kcr image of a runc container, signed by
// key if not nil, whose bundle holds a config.json.
func containerImage(t *testing.T, key ed25519.PrivateKey) string {
	t.Helper()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle")
	os.Mkdir(bundle, 0o700)
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o600)
	img := filepath.Join(dir, "img")
	b, err := images.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	os.WriteFile(filepath.Join(b.CRIUDir(), "inventory.img"), []byte("inv"), 0o600)
	os.WriteFile(filepath.Join(b.CRIUDir(), "pages-1.img"), bytes.Repeat([]byte{7}, 5000), 0o600)
	os.WriteFile(filepath.Join(b.Dir(), containerBundleFile), []byte(`{"id":"c","bundle":"`+bundle+`"}`), 0o600)
	if key != nil {
		b.SignWith(key)
	}
	if _, err := b.Commit(context.Background(), &images.Manifest{}); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestExportResult: every format reports what it read and wrote, the
// verification's warnings included; the bytes are those on disk.
func TestExportResult(t *testing.T) {
	img := containerImage(t, nil)
	if err := os.Chmod(filepath.Join(img, images.ManifestName), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := images.ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	for _, c := range []struct {
		format, output string
		stdout         bool
	}{
		{FormatKCR, "a" + images.ArchiveExt, false},
		{FormatKCR, "", true},
		{FormatCRIO, "a.tar", false},
		{FormatOCI, "oci", false},
	} {
		o := ExportOptions{Image: img, Format: c.format}
		if c.output != "" {
			o.Output = filepath.Join(t.TempDir(), c.output)
		}
		if c.stdout {
			o.Stdout = &stdout
		}
		res, err := Export(context.Background(), o)
		if err != nil {
			t.Fatalf("%s: %v", c.format, err)
		}
		var written int64
		if c.stdout {
			written = int64(stdout.Len())
		} else {
			written = imagetest.TreeSize(t, o.Output)
		}
		if res.Bytes != written || written == 0 {
			t.Errorf("%s to %q: Bytes %d, %d written", c.format, c.output, res.Bytes, written)
		}
		if res.ImageBytes != m.TotalSize() || res.ImageBytes < 5000 || res.Files != len(m.Files) || res.Files < 3 {
			t.Errorf("%s: image %d bytes in %d files, want %d in %d", c.format, res.ImageBytes, res.Files, m.TotalSize(), len(m.Files))
		}
		if !c.stdout {
			// Nothing but the export is left where it was written.
			if ents, _ := os.ReadDir(filepath.Dir(o.Output)); len(ents) != 1 {
				t.Errorf("%s: %d entries beside %s: %v", c.format, len(ents), c.output, ents)
			}
		}
		if res.Duration <= 0 {
			t.Errorf("%s: duration %v", c.format, res.Duration)
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "go-rwx") {
			t.Errorf("%s: warnings %q, want the loose mode of %s", c.format, res.Warnings, images.ManifestName)
		}
	}
}

// TestExportNeverReplaces: every format refuses an existing output with
// images.ErrExists, naming it and the fix, and leaves it as it was; a
// temporary left by a killed export of cri-o does not block the next one.
func TestExportNeverReplaces(t *testing.T) {
	img := containerImage(t, nil)
	for _, format := range []string{FormatKCR, FormatCRIO, FormatOCI} {
		dir := t.TempDir()
		out := filepath.Join(dir, "out")
		var err error
		if format == FormatOCI {
			err = os.Mkdir(out, 0o700) // even empty, it is the user's
		} else {
			err = os.WriteFile(out, []byte("mine"), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		_, err = Export(context.Background(), ExportOptions{Image: img, Format: format, Output: out})
		if !errors.Is(err, images.ErrExists) || !strings.Contains(err.Error(), out) || !strings.Contains(err.Error(), "choose another -o or remove it") {
			t.Errorf("%s over an existing %s: %v, want ErrExists naming it and the fix", format, out, err)
		}
		if format == FormatOCI {
			if ents, err := os.ReadDir(out); err != nil || len(ents) != 0 {
				t.Errorf("%s: existing directory now holds %v (%v)", format, ents, err)
			}
		} else if b, _ := os.ReadFile(out); string(b) != "mine" {
			t.Errorf("%s: existing file now holds %d bytes", format, len(b))
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Errorf("%s: refused export left %v", format, ents)
		}
	}

	dir := t.TempDir()
	out := filepath.Join(dir, "c.tar")
	stale := out + ".kcr-tmp" // the old fixed temporary name
	if err := os.WriteFile(stale, []byte("killed"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Export(context.Background(), ExportOptions{Image: img, Format: FormatCRIO, Output: out}); err != nil {
		t.Fatalf("cri-o export beside a stale temporary: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("entries %v, want the export and the stale temporary", ents)
	}

	// A failed export leaves nothing behind.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir = t.TempDir()
	if _, err := Export(ctx, ExportOptions{Image: img, Format: FormatCRIO, Output: filepath.Join(dir, "c.tar")}); err == nil {
		t.Fatal("cancelled export succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("cancelled export left %v", ents)
	}
}
