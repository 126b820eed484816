package images

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// FuzzReadManifest: whatever manifest.json holds, ReadManifest returns a
// manifest of kcr's format whose files are safe, distinct paths, or an
// *Error; it never panics.
func FuzzReadManifest(f *testing.F) {
	f.Add([]byte(`{"format":"kcr-image","format_version":1,"files":[{"path":"criu/a.img","size":1,"sha256":"` + strings.Repeat("0", 64) + `"}]}`))
	f.Add([]byte(`{"format":"kcr-image","format_version":1,"files":[{"path":"../x","size":1,"sha256":""}]}`))
	f.Add([]byte(`{"format":"kcr-image","format_version":2}`))
	f.Add([]byte(`{"format":"kcr-image","format_version":1,"files":[{"path":"verified","size":-1}]}`))
	f.Add([]byte("Z"))
	dir := filepath.Join(f.TempDir(), "img")
	if err := os.Mkdir(dir, 0o700); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, ManifestName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := ReadManifest(dir)
		if err != nil {
			if _, ok := errors.AsType[*Error](err); !ok {
				t.Fatalf("error is not an *images.Error: %v", err)
			}
			return
		}
		if m.Format != Format || m.FormatVersion < 1 || m.FormatVersion > FormatVersion {
			t.Fatalf("accepted format %q version %d", m.Format, m.FormatVersion)
		}
		seen := map[string]bool{}
		for _, e := range m.Files {
			if !fs.ValidPath(e.Path) || e.Path == "." || IsReserved(e.Path) || seen[e.Path] || e.Size < 0 {
				t.Fatalf("accepted file entry %+v", e)
			}
			seen[e.Path] = true
		}
	})
}

// FuzzImportEnd: after the tar's end, an archive may hold only zero
// padding (up to tarSlack): anything else, or more, is refused with
// ErrBadArchive, and the archive with nothing after its tar imports.
func FuzzImportEnd(f *testing.F) {
	img := filepath.Join(f.TempDir(), "img")
	b, err := Create(img)
	if err != nil {
		f.Fatal(err)
	}
	os.WriteFile(filepath.Join(b.CRIUDir(), "pages-1.img"), []byte("pages"), 0o600)
	if _, err := b.Commit(context.Background(), &Manifest{}); err != nil {
		f.Fatal(err)
	}
	archive := filepath.Join(f.TempDir(), "a"+ArchiveExt)
	if _, _, err := ExportFile(context.Background(), img, archive); err != nil {
		f.Fatal(err)
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		f.Fatal(err)
	}
	tarData := imagetest.Unzstd(f, data)
	f.Add([]byte{}, uint16(0))
	f.Add(make([]byte, 512), uint16(0))
	f.Add([]byte{0, 0, 1}, uint16(0))
	f.Add([]byte("more"), uint16(1024))
	f.Add(make([]byte, 16), uint16(tarSlack/16+1))
	dst := f.TempDir()
	i := 0
	f.Fuzz(func(t *testing.T, tail []byte, repeat uint16) {
		full := append([]byte{}, tarData...)
		for range int(repeat) + 1 {
			full = append(full, tail...)
		}
		trailer := full[len(tarData):]
		zeros := !strings.ContainsFunc(string(trailer), func(r rune) bool { return r != 0 })
		i++
		out := filepath.Join(dst, "img"+strings.Repeat("x", i%3)+string(rune('a'+i%26)))
		os.RemoveAll(out)
		im, err := Import(context.Background(), strings.NewReader(string(imagetest.Zstd(t, full))), out)
		switch ok := zeros && len(trailer) <= tarSlack; {
		case ok && err != nil:
			t.Fatalf("%d zero bytes after the tar: %v", len(trailer), err)
		case !ok && err == nil:
			t.Fatalf("%d bytes after the tar (zeros: %v) imported as %s", len(trailer), zeros, im.Dir)
		case !ok && !errors.Is(err, ErrBadArchive):
			t.Fatalf("%d bytes after the tar: %v, want ErrBadArchive", len(trailer), err)
		}
		os.RemoveAll(out)
	})
}
