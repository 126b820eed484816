package images

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// crioEntries lays a kcr image out as "kcr export --format cri-o" does:
// CRI-O's own files first, then kcr's manifest, then criu/ as checkpoint/.
func crioEntries(t *testing.T, dir string) []entry {
	t.Helper()
	out := []entry{regEntry("config.dump", []byte(`{"id":"c"}`)), regEntry("spec.dump", []byte(`{}`))}
	for _, e := range imageEntries(t, dir) {
		name := e.Hdr.Name
		switch {
		case name == ManifestName:
			name = CRIOManifestName
		case strings.HasPrefix(name, CRIUSubdir+"/"):
			name = CRIOCheckpointDir + strings.TrimPrefix(name, CRIUSubdir)
		}
		out = append(out, regEntry(name, e.Data))
	}
	return out
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "checkpoint.tar")
	must(t, os.WriteFile(p, data, 0o600))
	return p
}

// TestImportCRIO: a CRI-O layout archive of kcr's, plain or compressed,
// unpacks into the same image; CRI-O's files are left out.
func TestImportCRIO(t *testing.T) {
	src := build(t)
	for name, data := range map[string][]byte{
		"tar":     imagetest.Tar(t, crioEntries(t, src)),
		"tar.zst": imagetest.Archive(t, crioEntries(t, src)),
	} {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "img")
			img, err := ImportCRIOFile(context.Background(), writeFile(t, data), dst)
			if err != nil {
				t.Fatal(err)
			}
			sameImage(t, src, img.Dir)
			for _, f := range []string{"config.dump", "spec.dump", CRIOManifestName} {
				if _, err := os.Stat(filepath.Join(dst, f)); err == nil {
					t.Errorf("%s was unpacked into the image", f)
				}
			}
			if _, err := Open(context.Background(), dst); err != nil {
				t.Errorf("Open the imported image: %v", err)
			}
		})
	}
}

// TestImportCRIORefused: the checks of Import hold for CRI-O archives, and
// an archive without kcr's manifest is refused as not an image.
func TestImportCRIORefused(t *testing.T) {
	src := build(t)
	good := crioEntries(t, src)
	last := len(good) - 1
	tampered := append([]entry(nil), good...)
	d := append([]byte(nil), good[last].Data...)
	d[0] ^= 1
	tampered[last] = regEntry(good[last].Hdr.Name, d)
	for _, tc := range []struct {
		name    string
		entries []entry
		maxSize int64
		want    error
		frag    string
	}{
		{"no kcr manifest", good[:2], 0, ErrNotImage, CRIOManifestName},
		{"podman layout", []entry{regEntry("config.dump", nil), regEntry("checkpoint/inventory.img", nil)}, 0, ErrNotImage, "podman"},
		{"tampered", tampered, 0, ErrCorrupt, "sha256"},
		{"missing file", good[:last], 0, ErrMissing, "missing"},
		{"criu/ outside checkpoint/", append(append([]entry(nil), good...), regEntry("criu/extra", []byte("x"))), 0, ErrUnsafePath, "not listed"},
		{"second manifest", append(append([]entry(nil), good...), regEntry(ManifestName, []byte("{}"))), 0, ErrUnsafePath, "not listed"},
		{"unsafe path", append(append([]entry(nil), good...), regEntry("checkpoint/../../x", []byte("x"))), 0, ErrUnsafePath, ".."},
		{"too large", good, 10, ErrTooLarge, "--max-size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			var opts []ImportOption
			if tc.maxSize > 0 {
				opts = append(opts, WithMaxSize(tc.maxSize))
			}
			_, err := ImportCRIOFile(context.Background(), writeFile(t, imagetest.Tar(t, tc.entries)), filepath.Join(parent, "img"), opts...)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.frag) {
				t.Errorf("ImportCRIOFile: %v, want %v mentioning %q", err, tc.want, tc.frag)
			}
			nothingLeft(t, parent)
		})
	}
}

// TestCheckTrusted: an archive another user could have written is
// refused, as an image would be, naming the fix.
func TestCheckTrusted(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "checkpoint.tar")
	must(t, os.WriteFile(p, []byte("x"), 0o600))
	if err := CheckTrusted(p); err != nil {
		t.Fatalf("own archive: %v", err)
	}
	must(t, os.Chmod(p, 0o622))
	if err := CheckTrusted(p); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "--allow-untrusted") {
		t.Errorf("group-writable archive: %v", err)
	}
	must(t, os.Chmod(p, 0o600))
	sub := filepath.Join(dir, "oci")
	must(t, os.MkdirAll(filepath.Join(sub, "blobs"), 0o700))
	must(t, os.WriteFile(filepath.Join(sub, "blobs", "b"), nil, 0o600))
	must(t, os.Chmod(filepath.Join(sub, "blobs", "b"), 0o606)) // past the umask
	if err := CheckTrusted(sub); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "blobs/b") {
		t.Errorf("layout with a world-writable blob: %v", err)
	}
	if os.Geteuid() == 0 {
		must(t, os.Chmod(filepath.Join(sub, "blobs", "b"), 0o600))
		must(t, os.Chown(p, 61001, 61001))
		if err := CheckTrusted(p); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "uid 61001") {
			t.Errorf("archive of uid 61001: %v", err)
		}
	}
}
