package container

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest/containerimg"
)

// TestExportResult: every format reports what it read and wrote, the
// verification's warnings included; the bytes are those on disk.
func TestExportResult(t *testing.T) {
	img := containerimg.Write(t, containerimg.Options{})
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
		// The runtimes' formats also say that the spec names no base image.
		want := 1
		if c.format == FormatCRIO || c.format == FormatOCI {
			want = 2
		}
		if len(res.Warnings) != want || !strings.Contains(res.Warnings[0], "go-rwx") || (want == 2 && !strings.Contains(res.Warnings[1], "--base-image")) {
			t.Errorf("%s: warnings %q, want the loose mode of %s (and no base image for a runtime's format)", c.format, res.Warnings, images.ManifestName)
		}
	}
}

// TestExportNeverReplaces: every format refuses an existing output with
// images.ErrExists, naming it and the fix, and leaves it as it was; a
// temporary left by a killed export of cri-o does not block the next one.
func TestExportNeverReplaces(t *testing.T) {
	img := containerimg.Write(t, containerimg.Options{})
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
