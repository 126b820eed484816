package images

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// rleFrame is a zstd frame of run-length blocks that decompresses to n
// times 128 KiB of zeros in 4 bytes a block: the bomb of finding 8 of docs/security-paths.md.
func rleFrame(n int) []byte {
	f := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 7 << 3} // no checksum, no size; window 128 KiB
	for i := range n {
		h := uint32(128<<10)<<3 | 1<<1 // RLE block of 128 KiB
		if i == n-1 {
			h |= 1 // last
		}
		f = append(f, byte(h), byte(h>>8), byte(h>>16), 0)
	}
	return f
}

// TestSecurityImportDecompressionBomb (finding 8 of docs/security-paths.md): uid 61001's archive,
// with a frame of run-length blocks appended after the tar (4 GiB of
// zeros in 128 KiB), is refused without decompressing it all, with a
// --max-size just above the image; so is a CRI-O archive whose skipped
// entry (config.dump) is huge.
func TestSecurityImportDecompressionBomb(t *testing.T) {
	imagetest.NeedRoot(t)
	img := build(t)
	m, err := ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "a"+ArchiveExt)
	if _, _, err := ExportFile(context.Background(), img, archive); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(archive)
	bomb := filepath.Join(dir, "bomb"+ArchiveExt)
	os.WriteFile(bomb, append(data, rleFrame(32<<10)...), 0o600)
	imagetest.ChownAll(t, dir, imagetest.OtherUID)

	limit := WithMaxSize(m.TotalSize() + 1<<20)
	_, err = ImportFile(context.Background(), bomb, filepath.Join(t.TempDir(), "img"), limit)
	if !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), "after the end of its tar") {
		t.Errorf("import of an archive with 4 GiB of zeros after its tar: %v; want ErrBadArchive saying so", err)
	}
	// The archive itself still imports.
	if _, err := ImportFile(context.Background(), archive, filepath.Join(t.TempDir(), "img"), limit); err != nil {
		t.Errorf("the archive without the bomb: %v", err)
	}

	// A CRI-O archive: a config.dump of 64 MiB comes first, before the
	// signature could be checked.
	entries := imagetest.ReadTar(t, imagetest.Unzstd(t, data))
	var crio []imagetest.Entry
	crio = append(crio, imagetest.Entry{Hdr: tar.Header{Name: "config.dump", Mode: 0o600, Size: 64 << 20, Typeflag: tar.TypeReg}, Data: make([]byte, 64<<20)})
	for _, e := range entries {
		if e.Hdr.Name == ManifestName {
			e.Hdr.Name = CRIOManifestName
		} else if rest, ok := strings.CutPrefix(e.Hdr.Name, CRIUSubdir); ok {
			e.Hdr.Name = CRIOCheckpointDir + rest
		}
		crio = append(crio, e)
	}
	big := filepath.Join(t.TempDir(), "crio.tar")
	os.WriteFile(big, imagetest.Archive(t, crio), 0o600)
	_, err = ImportCRIOFile(context.Background(), big, filepath.Join(t.TempDir(), "img"), limit)
	if !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), "config.dump") {
		t.Errorf("import of a CRI-O archive with a 64 MiB config.dump: %v; want ErrBadArchive naming it", err)
	}
}
