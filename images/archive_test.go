package images

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// entry is one entry of a hand-made test archive.
type entry = imagetest.Entry

func regEntry(name string, data []byte) entry {
	return entry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: 0o600}, Data: data}
}

// imageEntries returns what Export archives for the image in dir:
// manifest.json, then the listed files in manifest order.
func imageEntries(t *testing.T, dir string) []entry {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := []entry{regEntry(ManifestName, raw)}
	for _, f := range m.Files {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, regEntry(f.Path, b))
	}
	return out
}

func exportBytes(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, _, err := Export(context.Background(), dir, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sameImage checks that two image directories hold the same manifest and
// listed files.
func sameImage(t *testing.T, want, got string) {
	t.Helper()
	for _, e := range imageEntries(t, want) {
		b, err := os.ReadFile(filepath.Join(got, filepath.FromSlash(e.Hdr.Name)))
		if err != nil {
			t.Errorf("%s: %v", e.Hdr.Name, err)
		} else if !bytes.Equal(b, e.Data) {
			t.Errorf("%s differs after the round trip", e.Hdr.Name)
		}
	}
}

// nothingLeft checks that a refused import left nothing in parent: no
// image, no temporary directory.
func nothingLeft(t *testing.T, parent string) {
	t.Helper()
	holdsOnly(t, parent, "refused import")
}

func TestExportImportRoundTrip(t *testing.T) {
	src := build(t)
	// Files the manifest does not list are not exported.
	must(t, os.WriteFile(filepath.Join(src, "restores"), []byte("3\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(src, "criu", "stats-restore"), []byte("x"), 0o600))

	data := exportBytes(t, src)
	var names []string
	for _, e := range imagetest.ReadArchive(t, data) {
		names = append(names, e.Hdr.Name)
		if e.Hdr.Typeflag != tar.TypeReg || e.Hdr.Mode != 0o600 || e.Hdr.Uid != 0 || e.Hdr.Uname != "" {
			t.Errorf("entry %s: type %q mode %o uid %d uname %q; want a plain 0600 file", e.Hdr.Name, e.Hdr.Typeflag, e.Hdr.Mode, e.Hdr.Uid, e.Hdr.Uname)
		}
	}
	var want []string
	for _, e := range imageEntries(t, src) {
		want = append(want, e.Hdr.Name)
	}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("archive entries %q, want %q", names, want)
	}
	if !bytes.Equal(exportBytes(t, src), data) {
		t.Error("exporting the same image twice gave different archives")
	}

	parent := t.TempDir()
	final := filepath.Join(parent, "imported")
	im, err := Import(context.Background(), bytes.NewReader(data), final)
	if err != nil {
		t.Fatal(err)
	}
	if im.Dir != final {
		t.Errorf("Dir = %q, want %q", im.Dir, final)
	}
	holdsOnly(t, parent, "import", "imported")
	opened := openClean(t, final)
	orig, _ := ReadManifest(src)
	if !reflect.DeepEqual(opened.Manifest, orig) || !reflect.DeepEqual(im.Manifest, orig) {
		t.Error("manifest changed in the round trip")
	}
	sameImage(t, src, final)
	checkPrivate(t, final, []string{"", "criu", "criu/sub", "criu/sub/deeper"}, append(want, ManifestName))
}

func TestExportImportFile(t *testing.T) {
	src := build(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "img"+ArchiveExt)
	im, size, err := ExportFile(context.Background(), src, file)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size || size == 0 {
		t.Errorf("ExportFile reported %d bytes, file has %d", size, fi.Size())
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("archive mode %04o, want 0600", fi.Mode().Perm())
	}
	if im.Dir != src || im.Size() == 0 {
		t.Errorf("ExportFile image %q size %d", im.Dir, im.Size())
	}
	holdsOnly(t, dir, "ExportFile", "img"+ArchiveExt)

	// An existing file is never replaced.
	_, _, err = ExportFile(context.Background(), src, file)
	checkErr(t, err, ErrExists, file, "already exists; choose another -o or remove it")
	if fi2, _ := os.Stat(file); fi2.Size() != fi.Size() || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Error("existing archive was modified")
	}
	if _, _, err := ExportFile(context.Background(), src, filepath.Join(dir, "nope", "x.tar.zst")); err == nil || !strings.Contains(err.Error(), "no such file or directory: create it first") {
		t.Errorf("ExportFile into a missing directory: %v", err)
	}

	final := filepath.Join(t.TempDir(), "img")
	if _, err := ImportFile(context.Background(), file, final); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), final); err != nil {
		t.Fatal(err)
	}
	sameImage(t, src, final)

	missing := filepath.Join(dir, "missing.tar.zst")
	_, err = ImportFile(context.Background(), missing, filepath.Join(t.TempDir(), "x"))
	checkErr(t, err, ErrNotExist, missing, "does not exist")
	_, err = ImportFile(context.Background(), src, filepath.Join(t.TempDir(), "x"))
	checkErr(t, err, ErrBadArchive, "is a directory, not an archive")
}

func TestExportDamagedImage(t *testing.T) {
	src := build(t)
	p := filepath.Join(src, "criu", "pages-1.img")
	b, _ := os.ReadFile(p)
	b[100] ^= 0xff
	must(t, os.WriteFile(p, b, 0o600))

	var buf bytes.Buffer
	_, _, err := Export(context.Background(), src, &buf)
	checkErr(t, err, ErrCorrupt, "criu/pages-1.img is corrupt: sha256 mismatch")
	if buf.Len() != 0 {
		t.Errorf("Export wrote %d bytes of a damaged image", buf.Len())
	}
	dir := t.TempDir()
	_, _, err = ExportFile(context.Background(), src, filepath.Join(dir, "a.tar.zst"))
	checkErr(t, err, ErrCorrupt, "criu/pages-1.img")
	nothingLeft(t, dir)

	_, _, err = Export(context.Background(), filepath.Join(dir, "none"), io.Discard)
	checkErr(t, err, ErrNotExist)
}

// TestImportTampered flips one byte of a file's payload inside the tar
// stream: the zstd layer is valid, the SHA-256 is not.
func TestImportTampered(t *testing.T) {
	src := build(t)
	raw := imagetest.Unzstd(t, exportBytes(t, src))
	i := bytes.Index(raw, bytes.Repeat([]byte{0xAB}, 4096)) // criu/pages-1.img
	if i < 0 {
		t.Fatal("pages-1.img payload not found in the tar stream")
	}
	raw[i+1000] ^= 0x01
	data := imagetest.Zstd(t, raw)

	parent := t.TempDir()
	final := filepath.Join(parent, "img")
	_, err := Import(context.Background(), bytes.NewReader(data), final)
	checkErr(t, err, ErrCorrupt, final, "criu/pages-1.img is corrupt: sha256 mismatch", "export the image again")
	if e, ok := errors.AsType[*Error](err); !ok || e.Path != "criu/pages-1.img" {
		t.Errorf("error path: %+v", e)
	}
	nothingLeft(t, parent)

	// ImportFile names the archive.
	file := filepath.Join(t.TempDir(), "bad.tar.zst")
	must(t, os.WriteFile(file, data, 0o600))
	_, err = ImportFile(context.Background(), file, final)
	checkErr(t, err, ErrCorrupt, file, "criu/pages-1.img is corrupt")
	nothingLeft(t, parent)
}

func TestImportTruncated(t *testing.T) {
	src := build(t)
	data := exportBytes(t, src)
	parent := t.TempDir()
	final := filepath.Join(parent, "img")
	for _, n := range []int{len(data) / 2, len(data) - 5, 10, 4} {
		_, err := Import(context.Background(), bytes.NewReader(data[:n]), final)
		t.Logf("cut at %d of %d: %v", n, len(data), err)
		checkErr(t, err, ErrBadArchive, final, "truncated", "copy it again")
		nothingLeft(t, parent)
	}
	// Damaged compressed data is refused too, whatever layer notices it.
	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 0x55
	_, err := Import(context.Background(), bytes.NewReader(bad), final)
	t.Logf("damaged compressed data: %v", err)
	if err == nil {
		t.Error("import of damaged compressed data succeeded")
	} else if !errors.Is(err, ErrBadArchive) && !errors.Is(err, ErrCorrupt) {
		t.Errorf("damaged compressed data: %v; want ErrBadArchive or ErrCorrupt", err)
	}
	nothingLeft(t, parent)
}

func TestImportRefused(t *testing.T) {
	src := build(t)
	good := imageEntries(t, src) // manifest, then 8 files
	outside := t.TempDir()
	abs := filepath.Join(outside, "abs-evil")

	with := func(extra ...entry) []entry { return append(append([]entry{}, good...), extra...) }
	hdr := func(typ byte, name, link string) entry {
		return entry{Hdr: tar.Header{Typeflag: typ, Name: name, Linkname: link, Mode: 0o600}, Data: nil}
	}
	manifest := func(edit func(m map[string]any)) []entry {
		var m map[string]any
		must(t, json.Unmarshal(good[0].Data, &m))
		edit(m)
		b, err := json.Marshal(m)
		must(t, err)
		return append([]entry{regEntry(ManifestName, b)}, good[1:]...)
	}
	resized := func(i int, data []byte) []entry {
		out := append([]entry{}, good...)
		out[i] = regEntry(out[i].Hdr.Name, data)
		return out
	}

	tests := []struct {
		name    string
		entries []entry
		raw     []byte // instead of entries
		want    error
		frags   []string
	}{
		{"dot-dot", with(regEntry("../evil", []byte("pwned"))), nil, ErrUnsafePath, []string{`"../evil"`, `".." component`}},
		{"inner dot-dot", with(regEntry("criu/../../evil", []byte("pwned"))), nil, ErrUnsafePath, []string{`".." component`}},
		{"absolute", with(regEntry(abs, []byte("pwned"))), nil, ErrUnsafePath, []string{"absolute path"}},
		{"unclean", with(regEntry("criu/./x", nil)), nil, ErrUnsafePath, []string{"not a clean relative path"}},
		{"symlink", with(hdr(tar.TypeSymlink, "criu/link", "/etc/passwd")), nil, ErrUnsafePath, []string{"criu/link is a symlink", "only regular files and directories"}},
		{"symlink over a listed file", append([]entry{good[0], hdr(tar.TypeSymlink, "criu/core-1.img", "/etc/shadow")}, good[2:]...), nil, ErrUnsafePath, []string{"criu/core-1.img is a symlink"}},
		{"hard link", with(hdr(tar.TypeLink, "criu/hl", "criu/core-1.img")), nil, ErrUnsafePath, []string{"hard link"}},
		{"device", with(entry{Hdr: tar.Header{Typeflag: tar.TypeChar, Name: "criu/null", Devmajor: 1, Devminor: 3, Mode: 0o600}, Data: nil}), nil, ErrUnsafePath, []string{"character device"}},
		{"fifo", with(hdr(tar.TypeFifo, "criu/fifo", "")), nil, ErrUnsafePath, []string{"named pipe"}},
		{"unlisted file", with(regEntry("criu/extra.img", []byte("x"))), nil, ErrUnsafePath, []string{"criu/extra.img is not listed in manifest.json"}},
		{"unlisted dir", with(hdr(tar.TypeDir, "evil/", "")), nil, ErrUnsafePath, []string{"evil/ is a directory that holds no file listed"}},
		{"duplicate", with(good[3]), nil, ErrUnsafePath, []string{good[3].Hdr.Name + " appears twice"}},
		{"second manifest", with(good[0]), nil, ErrUnsafePath, []string{"manifest.json appears twice"}},
		{"missing file", append(append([]entry{}, good[:2]...), good[3:]...), nil, ErrMissing, []string{good[2].Hdr.Name + " is missing from the archive"}},
		{"manifest not first", append([]entry{good[1], good[0]}, good[2:]...), nil, ErrNotImage, []string{`first archive entry is "` + good[1].Hdr.Name + `", not manifest.json`}},
		{"no manifest", good[1:], nil, ErrNotImage, []string{"not manifest.json"}},
		{"shorter than manifest", resized(4, []byte("short")), nil, ErrTruncated, []string{good[4].Hdr.Name + " is truncated: 5 bytes, manifest says"}},
		{"longer than manifest", resized(4, bytes.Repeat([]byte{1}, 5000)), nil, ErrCorrupt, []string{good[4].Hdr.Name + " is corrupt: 5000 bytes"}},
		{"oversize manifest", []entry{regEntry(ManifestName, bytes.Repeat([]byte(" "), MaxManifestSize+1))}, nil, ErrCorruptManifest, []string{"larger than"}},
		{"corrupt manifest", []entry{regEntry(ManifestName, []byte("{"))}, nil, ErrCorruptManifest, []string{"manifest.json is corrupt", "export the image again"}},
		{"manifest lists ../", manifest(setFirstPath("../x")), nil, ErrUnsafePath, []string{`lists "../x"`}},
		{"manifest lists itself", manifest(setFirstPath(ManifestName)), nil, ErrUnsafePath, []string{"reserves"}},
		{"manifest lists the signature", manifest(setFirstPath(SignatureName)), nil, ErrUnsafePath, []string{`lists "manifest.sig"`, "reserves"}},
		{"manifest lists the cache", manifest(setFirstPath(VerifiedName)), nil, ErrUnsafePath, []string{`lists "verified"`, "reserves"}},
		{"manifest lists the counter", manifest(setFirstPath(GenerationName)), nil, ErrUnsafePath, []string{`lists "restores"`, "reserves"}},
		{"newer format", manifest(func(m map[string]any) { m["format_version"] = 99 }), nil, ErrVersion, []string{"upgrade kcr"}},
		{"empty", nil, nil, ErrBadArchive, []string{"is empty"}},
		{"not zstd", nil, imagetest.Tar(t, good), ErrBadArchive, []string{"not a zstd-compressed archive"}},
		{"not tar", nil, imagetest.Zstd(t, bytes.Repeat([]byte("not a tar "), 100)), ErrBadArchive, []string{"not a valid tar stream"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.raw
			if data == nil {
				data = imagetest.Archive(t, tc.entries)
			}
			parent := t.TempDir()
			final := filepath.Join(parent, "img")
			_, err := Import(context.Background(), bytes.NewReader(data), final)
			t.Log(err)
			checkErr(t, err, tc.want, tc.frags...)
			if tc.want != ErrBadArchive && errors.Is(err, ErrBadArchive) {
				t.Errorf("error %q also matches ErrBadArchive", err)
			}
			nothingLeft(t, parent)
			for _, p := range []string{filepath.Join(parent, "evil"), filepath.Join(filepath.Dir(parent), "evil"), abs} {
				if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s written outside the image: %v", p, err)
				}
			}
		})
	}
}

func TestImportDirectoryEntries(t *testing.T) {
	src := build(t)
	good := imageEntries(t, src)
	dir := func(name string) entry {
		return entry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}, Data: nil}
	}
	entries := append([]entry{good[0], dir("criu/"), dir("criu/sub/"), dir("criu/sub/deeper/")}, good[1:]...)
	final := filepath.Join(t.TempDir(), "img")
	if _, err := Import(context.Background(), bytes.NewReader(imagetest.Archive(t, entries)), final); err != nil {
		t.Fatal(err)
	}
	openPrivate(t, final)
	checkPrivate(t, final, []string{"criu/sub"}, nil)
}

func TestImportDestination(t *testing.T) {
	data := exportBytes(t, build(t))
	parent := t.TempDir()

	full := filepath.Join(parent, "full")
	must(t, os.MkdirAll(full, 0o700))
	must(t, os.WriteFile(filepath.Join(full, "precious"), []byte("keep"), 0o600))
	_, err := Import(context.Background(), bytes.NewReader(data), full)
	checkErr(t, err, ErrExists, full, "already exists; choose another -o or remove it")
	holdsOnly(t, full, "import over an existing directory", "precious")
	holdsOnly(t, parent, "import over an existing directory", "full")

	empty := filepath.Join(parent, "empty")
	must(t, os.Mkdir(empty, 0o755))
	if _, err := Import(context.Background(), bytes.NewReader(data), empty); err != nil {
		t.Fatalf("import into an empty directory: %v", err)
	}
	openPrivate(t, empty)
}

func TestImportCanceled(t *testing.T) {
	data := exportBytes(t, build(t))
	parent := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Import(ctx, bytes.NewReader(data), filepath.Join(parent, "img"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Import with canceled ctx: %v", err)
	}
	nothingLeft(t, parent)
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Export returns the verified image with its warnings and the archive's
// size, and keeps no descriptor of the image open.
func TestExportReturnsImage(t *testing.T) {
	src := build(t)
	must(t, os.Chmod(filepath.Join(src, "criu", "pages-1.img"), 0o644)) // a verification warning
	var buf bytes.Buffer
	Export(context.Background(), src, io.Discard) // warm up (zstd pools, the verified cache)
	before := openFDs(t)
	im, n, err := Export(context.Background(), src, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if after := openFDs(t); after != before {
		t.Errorf("Export left %d descriptors open", after-before)
	}
	if n != int64(buf.Len()) || n == 0 {
		t.Errorf("Export counted %d bytes, wrote %d", n, buf.Len())
	}
	if im.Dir != src || len(im.Manifest.Files) == 0 || len(im.Warnings) != 1 || !strings.Contains(im.Warnings[0], "go-rwx") {
		t.Errorf("image %s, %d files, warnings %q", im.Dir, len(im.Manifest.Files), im.Warnings)
	}
}

// TestRenameNoReplace: neither a file nor a directory, even an empty one,
// is ever replaced; a free name is taken.
func TestRenameNoReplace(t *testing.T) {
	dir := t.TempDir()
	f, d := filepath.Join(dir, "f"), filepath.Join(dir, "d")
	os.WriteFile(f, []byte("src"), 0o600)
	os.Mkdir(d, 0o700)
	os.WriteFile(filepath.Join(d, "x"), nil, 0o600)
	for _, src := range []string{f, d} {
		dstFile, dstDir := filepath.Join(dir, "userfile"), filepath.Join(dir, "userdir")
		os.WriteFile(dstFile, []byte("mine"), 0o600)
		os.Mkdir(dstDir, 0o700)
		for _, dst := range []string{dstFile, dstDir} {
			if err := RenameNoReplace(src, dst); !errors.Is(err, fs.ErrExist) {
				t.Errorf("%s over %s: %v, want fs.ErrExist", src, dst, err)
			}
			if _, err := os.Lstat(src); err != nil {
				t.Errorf("%s gone after a refused rename: %v", src, err)
			}
		}
		if b, _ := os.ReadFile(dstFile); string(b) != "mine" {
			t.Errorf("%s replaced", dstFile)
		}
		if ents, _ := os.ReadDir(dstDir); len(ents) != 0 {
			t.Errorf("%s replaced: %v", dstDir, ents)
		}
		free := src + ".new"
		if err := RenameNoReplace(src, free); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(free); err != nil {
			t.Error(err)
		}
		os.Remove(dstFile)
		os.Remove(dstDir)
	}
}
