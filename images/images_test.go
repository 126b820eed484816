package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var sentinels = []error{
	ErrNotExist, ErrNotDir, ErrEmpty, ErrNotImage, ErrIncomplete, ErrCorruptManifest,
	ErrVersion, ErrMissing, ErrTruncated, ErrCorrupt, ErrUnsafePath, ErrExists,
}

// testFiles is what a fake CRIU dump writes into criu/.
var testFiles = map[string][]byte{
	"core-1.img":      []byte("core image"),
	"pages-1.img":     bytes.Repeat([]byte{0xAB}, 4096),
	"pages-2.img":     bytes.Repeat([]byte{0xCD}, 100),
	"sub/nested.img":  []byte("nested"),
	"dump.log":        []byte("(00.000000) Dumping finished successfully\n"),
	"inventory.img":   {},
	"stats-dump":      {1, 2, 3},
	"sub/deeper/x.db": []byte("deep"),
}

func testManifest() *Manifest {
	return &Manifest{
		KCRVersion:  "v0.1.0",
		CRIUVersion: "4.0",
		Kernel:      "6.8.0",
		Host:        "box",
		Created:     time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC),
		Process: Process{
			PID: 42, Exe: "/usr/bin/app", Cmdline: []string{"app", "-x"},
			Cwd: "/srv", UID: 1000, Comm: "app", RSSBytes: 1 << 20,
		},
		ControlSocket: "/run/app.sock",
		Options:       Options{LeaveRunning: true, TCPClose: true, FileLocks: true},
		Resources: []ResourceReport{
			{Name: "db", DurationNS: 12_300_000, Details: map[string]any{"conns": 4.0, "mode": "drain"}},
			{Name: "kafka", DurationNS: 5, Error: "timeout"},
		},
		Phases:    []Phase{{Name: "hooks", DurationNS: 1000}, {Name: "total", DurationNS: 5000}},
		CRIUStats: CRIUStats{FreezingTimeUS: 10, PagesWritten: 25},
	}
}

// writeDump fills dir the way CRIU would, with deliberately loose modes.
func writeDump(t *testing.T, dir string) {
	t.Helper()
	for name, data := range testFiles {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// build commits a complete image at <tmp>/img and returns its path.
func build(t *testing.T) string {
	t.Helper()
	return buildSigned(t, nil)
}

func mode(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// checkPrivate asserts that the image dir and its directories below it
// (dirs, relative) have mode 0700, and its files (relative) 0600.
func checkPrivate(t *testing.T, dir string, dirs, files []string) {
	t.Helper()
	for _, d := range dirs {
		if m := mode(t, filepath.Join(dir, d)); m != 0o700 {
			t.Errorf("%s/ mode %04o, want 0700", d, m)
		}
	}
	for _, f := range files {
		if m := mode(t, filepath.Join(dir, f)); m != 0o600 {
			t.Errorf("%s mode %04o, want 0600", f, m)
		}
	}
}

// openPrivate asserts that dir opens as an image and has mode 0700.
func openPrivate(t *testing.T, dir string) {
	t.Helper()
	if _, err := Open(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	checkPrivate(t, dir, []string{""}, nil)
}

// holdsOnly fails t unless dir holds exactly the entries want (nothing if
// none) once after is done.
func holdsOnly(t *testing.T, dir, after string, want ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Errorf("after %s, %s holds %q; want %q", after, dir, got, want)
	}
}

// openClean opens the image in dir and fails t unless it has neither extra
// files nor warnings.
func openClean(t *testing.T, dir string) *Image {
	t.Helper()
	im, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Extra) != 0 || len(im.Warnings) != 0 {
		t.Errorf("image %s: Extra %q, Warnings %q; want none", dir, im.Extra, im.Warnings)
	}
	return im
}

// checkErr asserts err matches want (and no other sentinel) and that its
// message contains every fragment.
func checkErr(t *testing.T, err, want error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %v", want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("error %q does not match %v", err, want)
	}
	for _, s := range sentinels {
		if s != want && errors.Is(err, s) {
			t.Errorf("error %q also matches %v", err, s)
		}
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not contain %q", err, f)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q spans several lines", err)
	}
}

func TestRoundTrip(t *testing.T) {
	parent := t.TempDir()
	final := filepath.Join(parent, "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Base(b.Dir()); !strings.HasPrefix(got, ".img.kcr-tmp-") {
		t.Errorf("temporary dir %q is not a hidden .img.kcr-tmp- sibling", got)
	}
	if filepath.Dir(b.Dir()) != parent {
		t.Errorf("temporary dir %q is not in %q", b.Dir(), parent)
	}
	if _, err := os.Stat(final); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("final path exists before Commit: %v", err)
	}
	writeDump(t, b.CRIUDir())
	want := testManifest()
	committed, err := b.Commit(context.Background(), want)
	if err != nil {
		t.Fatal(err)
	}
	if committed.Dir != final {
		t.Errorf("committed Dir = %q, want %q", committed.Dir, final)
	}
	if err := b.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
	holdsOnly(t, parent, "Commit then Abort", "img")

	im := openClean(t, final)
	if im.CRIUDir() != filepath.Join(final, "criu") {
		t.Errorf("CRIUDir = %q", im.CRIUDir())
	}
	got := im.Manifest
	if got.Format != Format || got.FormatVersion != FormatVersion {
		t.Errorf("format = %q v%d", got.Format, got.FormatVersion)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("manifest changed in round trip:\n got %+v\nwant %+v", got, want)
	}

	var paths []string
	var total, pages int64
	for _, f := range got.Files {
		paths = append(paths, f.Path)
		data := testFiles[strings.TrimPrefix(f.Path, "criu/")]
		sum := sha256.Sum256(data)
		if f.Size != int64(len(data)) || f.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: size %d sha %s, want %d %x", f.Path, f.Size, f.SHA256, len(data), sum)
		}
		total += int64(len(data))
	}
	pages = 4096 + 100
	wantPaths := []string{
		"criu/core-1.img", "criu/dump.log", "criu/inventory.img", "criu/pages-1.img",
		"criu/pages-2.img", "criu/stats-dump", "criu/sub/deeper/x.db", "criu/sub/nested.img",
	}
	if !reflect.DeepEqual(paths, wantPaths) {
		t.Errorf("files = %q, want %q", paths, wantPaths)
	}
	if im.Size() != total || got.TotalSize() != total {
		t.Errorf("size = %d, want %d", im.Size(), total)
	}
	if got.PagesSize() != pages {
		t.Errorf("PagesSize = %d, want %d", got.PagesSize(), pages)
	}

	checkPrivate(t, final, []string{"", "criu", "criu/sub", "criu/sub/deeper"}, append(wantPaths, ManifestName))

	quick, err := ReadManifest(final)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(quick, got) {
		t.Errorf("ReadManifest differs from Open")
	}
	raw, err := os.ReadFile(filepath.Join(final, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"format": "kcr-image"`, `"duration_ns": 12300000`, `"freezing_time_us": 10`, `"rss_bytes"`} {
		if !bytes.Contains(raw, []byte(key)) {
			t.Errorf("manifest.json lacks %s", key)
		}
	}
}

func TestCommitFillsCreated(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manifest{}
	before := time.Now()
	if _, err := b.Commit(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if m.Created.Location() != time.UTC || m.Created.Before(before.Add(-time.Second)) {
		t.Errorf("Created = %v, want now in UTC", m.Created)
	}
	if m.Files == nil || len(m.Files) != 0 {
		t.Errorf("Files = %v", m.Files)
	}
	if _, err := Open(context.Background(), final); err != nil {
		t.Errorf("image without files: %v", err)
	}
	if _, err := b.Commit(context.Background(), m); err == nil {
		t.Error("second Commit succeeded")
	}
}

// A writer that still holds a file open (kcr's action-script watcher holds
// CRIU's log) must not break the image after Commit: Detach cuts it off.
func TestDetachKeepsLateWritesOut(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	log := filepath.Join(b.CRIUDir(), "dump.log")
	late, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	late.WriteString("before the detach\n")
	if err := b.Detach("criu/dump.log"); err != nil {
		t.Fatal(err)
	}
	if err := b.Detach("criu/absent.log"); err != nil {
		t.Errorf("Detach of a missing file: %v", err)
	}
	if _, err := b.Commit(context.Background(), testManifest()); err != nil {
		t.Fatal(err)
	}
	late.WriteString("after the commit\n")
	if _, err := Open(context.Background(), final); err != nil {
		t.Fatalf("image after a late write to a detached file: %v", err)
	}
	got, _ := os.ReadFile(filepath.Join(final, "criu", "dump.log"))
	if want := string(testFiles["dump.log"]) + "before the detach\n"; string(got) != want {
		t.Errorf("dump.log = %q, want only what was written before Detach", got)
	}
}

func TestAbort(t *testing.T) {
	parent := t.TempDir()
	b, err := Create(filepath.Join(parent, "img"))
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	if err := b.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := b.Abort(); err != nil {
		t.Errorf("second Abort: %v", err)
	}
	holdsOnly(t, parent, "Abort")
	if _, err := b.Commit(context.Background(), testManifest()); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

func TestOpenUncommitted(t *testing.T) {
	b, err := Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	writeDump(t, b.CRIUDir())
	_, err = Open(context.Background(), b.Dir())
	checkErr(t, err, ErrIncomplete, b.Dir(), "interrupted checkpoint", "delete it")
	_, err = ReadManifest(b.Dir())
	checkErr(t, err, ErrIncomplete)
}

func TestCreateDestination(t *testing.T) {
	parent := t.TempDir()

	full := filepath.Join(parent, "full")
	if err := os.MkdirAll(filepath.Join(full, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := Create(full)
	checkErr(t, err, ErrExists, full, "already exists; choose another -o or remove it")

	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Create(file)
	checkErr(t, err, ErrExists, file)

	if _, err := Create(filepath.Join(parent, "nope", "img")); err == nil || !strings.Contains(err.Error(), "no such file or directory: create it first") {
		t.Errorf("Create under missing parent: %v", err)
	}
	if _, err := Create(filepath.Join(parent, "x.kcr-tmp-1")); err == nil {
		t.Error("Create accepted a name containing .kcr-tmp-")
	}

	empty := filepath.Join(parent, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := Create(empty)
	if err != nil {
		t.Fatalf("Create into empty dir: %v", err)
	}
	writeDump(t, b.CRIUDir())
	if _, err := b.Commit(context.Background(), testManifest()); err != nil {
		t.Fatalf("Commit over empty dir: %v", err)
	}
	openPrivate(t, empty)
}

func TestCommitDestinationFilledMeanwhile(t *testing.T) {
	parent := t.TempDir()
	final := filepath.Join(parent, "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	if err := os.Mkdir(final, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(final, "precious"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = b.Commit(context.Background(), testManifest())
	checkErr(t, err, ErrExists, final, "choose another -o")
	if err := b.Abort(); err != nil {
		t.Fatal(err)
	}
	holdsOnly(t, parent, "Commit over an existing directory", "img")
	holdsOnly(t, final, "Commit over an existing directory", "precious")
}

func TestCommitRefusesSymlink(t *testing.T) {
	b, err := Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	writeDump(t, b.CRIUDir())
	if err := os.Symlink("/etc/passwd", filepath.Join(b.CRIUDir(), "link")); err != nil {
		t.Fatal(err)
	}
	_, err = b.Commit(context.Background(), testManifest())
	checkErr(t, err, ErrUnsafePath, "criu/link is a symlink")
}

func TestCommitCanceled(t *testing.T) {
	parent := t.TempDir()
	b, err := Create(filepath.Join(parent, "img"))
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Commit(ctx, testManifest()); !errors.Is(err, context.Canceled) {
		t.Errorf("Commit with canceled ctx: %v", err)
	}
	b.Abort()
	holdsOnly(t, parent, "cancelled Commit")
}

// editManifest rewrites an image's manifest.
func editManifest(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, ManifestName)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	data, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func setFirstPath(p string) func(map[string]any) {
	return func(m map[string]any) {
		m["files"].([]any)[0].(map[string]any)["path"] = p
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenDamaged(t *testing.T) {
	tests := []struct {
		name      string
		damage    func(t *testing.T, dir string)
		want      error
		fragments []string
	}{
		{"flipped byte", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "criu/pages-1.img")
			data, err := os.ReadFile(p)
			must(t, err)
			data[2000] ^= 1
			must(t, os.WriteFile(p, data, 0o600))
		}, ErrCorrupt, []string{"criu/pages-1.img is corrupt: sha256 mismatch"}},
		{"truncated file", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, "criu/pages-1.img"), 1234))
		}, ErrTruncated, []string{"criu/pages-1.img is truncated: 1234 bytes, manifest says 4096"}},
		{"grown file", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, "criu/core-1.img"), 5000))
		}, ErrCorrupt, []string{"criu/core-1.img is corrupt: 5000 bytes"}},
		{"deleted file", func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, "criu/sub/nested.img")))
		}, ErrMissing, []string{"criu/sub/nested.img is missing"}},
		{"deleted directory", func(t *testing.T, dir string) {
			must(t, os.RemoveAll(filepath.Join(dir, "criu/sub")))
		}, ErrMissing, []string{"criu/sub/deeper/x.db is missing"}},
		{"file replaced by dir", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "criu/dump.log")
			must(t, os.Remove(p))
			must(t, os.Mkdir(p, 0o700))
		}, ErrCorrupt, []string{"criu/dump.log is corrupt: a directory"}},
		{"file replaced by symlink", func(t *testing.T, dir string) {
			// Same content outside the image: only the symlink is wrong.
			p := filepath.Join(dir, "criu/core-1.img")
			out := filepath.Join(t.TempDir(), "outside")
			must(t, os.WriteFile(out, testFiles["core-1.img"], 0o600))
			must(t, os.Remove(p))
			must(t, os.Symlink(out, p))
		}, ErrUnsafePath, []string{"criu/core-1.img is a symlink"}},
		{"directory replaced by symlink", func(t *testing.T, dir string) {
			out := filepath.Join(t.TempDir(), "criu")
			must(t, os.Rename(filepath.Join(dir, "criu"), out))
			must(t, os.Symlink(out, filepath.Join(dir, "criu")))
		}, ErrUnsafePath, []string{"criu is a symlink"}},
		{"manifest deleted", func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, ManifestName)))
		}, ErrNotImage, []string{"manifest.json missing: not a kcr image", `"kcr checkpoint"`}},
		{"manifest only half written", func(t *testing.T, dir string) {
			must(t, os.Rename(filepath.Join(dir, ManifestName), filepath.Join(dir, manifestTmp)))
		}, ErrIncomplete, []string{"interrupted checkpoint"}},
		{"manifest truncated", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestName)
			fi, err := os.Stat(p)
			must(t, err)
			must(t, os.Truncate(p, fi.Size()/2))
		}, ErrCorruptManifest, []string{"manifest.json is corrupt: unexpected end of JSON input"}},
		{"manifest empty", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, ManifestName), 0))
		}, ErrCorruptManifest, []string{"manifest.json is corrupt"}},
		{"manifest huge", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, ManifestName), MaxManifestSize+1))
		}, ErrCorruptManifest, []string{"larger than"}},
		{"manifest wrong type", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m["process"] = "pid 1" })
		}, ErrCorruptManifest, []string{"manifest.json is corrupt"}},
		{"manifest symlink", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestName)
			out := filepath.Join(t.TempDir(), ManifestName)
			must(t, os.Rename(p, out))
			must(t, os.Symlink(out, p))
		}, ErrUnsafePath, []string{"manifest.json is a symlink, not a regular file"}},
		{"path with dotdot", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("../x"))
		}, ErrUnsafePath, []string{`"../x"`, "escapes the image"}},
		{"inner dotdot", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("criu/../../x"))
		}, ErrUnsafePath, []string{`"criu/../../x"`}},
		{"absolute path", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("/etc/passwd"))
		}, ErrUnsafePath, []string{`"/etc/passwd"`}},
		{"duplicate path", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("criu/dump.log"))
		}, ErrCorruptManifest, []string{"criu/dump.log is listed twice"}},
		{"reserved name verified", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("verified"))
		}, ErrUnsafePath, []string{`lists "verified", a name kcr reserves`}},
		{"reserved name restores", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("restores"))
		}, ErrUnsafePath, []string{`lists "restores", a name kcr reserves`}},
		{"reserved name verified.tmp", func(t *testing.T, dir string) {
			editManifest(t, dir, setFirstPath("verified.tmp"))
		}, ErrUnsafePath, []string{`lists "verified.tmp"`}},
		{"bad sha256", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) {
				m["files"].([]any)[0].(map[string]any)["sha256"] = "xyz"
			})
		}, ErrCorruptManifest, []string{"invalid sha256"}},
		{"wrong format", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m["format"] = "docker-image" })
		}, ErrNotImage, []string{`not a kcr image (format "docker-image"`}},
		{"no format", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte(`{"name":"x"}`), 0o600))
		}, ErrNotImage, []string{`format ""`}},
		{"future version", func(t *testing.T, dir string) {
			// A future version may change field types; the version wins.
			editManifest(t, dir, func(m map[string]any) { m["format_version"] = 2; m["files"] = "elsewhere" })
		}, ErrVersion, []string{"image format version 2 is newer than this kcr supports (1): upgrade kcr"}},
		{"zero version", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m["format_version"] = 0 })
		}, ErrCorruptManifest, []string{"format_version 0 is invalid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := build(t)
			tt.damage(t, dir)
			_, err := Open(context.Background(), dir)
			checkErr(t, err, tt.want, append(tt.fragments, dir)...)
		})
	}
}

func TestErrorPath(t *testing.T) {
	dir := build(t)
	must(t, os.Truncate(filepath.Join(dir, "criu/pages-2.img"), 0))
	_, err := Open(context.Background(), dir)
	e, ok := errors.AsType[*Error](err)
	if !ok {
		t.Fatalf("error %v is not *Error", err)
	}
	if e.Dir != dir || e.Path != "criu/pages-2.img" || e.Kind != ErrTruncated {
		t.Errorf("Error = %+v", e)
	}
}

func TestReadManifestSkipsHashing(t *testing.T) {
	dir := build(t)
	must(t, os.Truncate(filepath.Join(dir, "criu/pages-1.img"), 1))
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Process.PID != 42 {
		t.Errorf("pid = %d", m.Process.PID)
	}
	// ReadManifest still validates format and paths.
	editManifest(t, dir, func(m map[string]any) { m["format_version"] = 7 })
	_, err = ReadManifest(dir)
	checkErr(t, err, ErrVersion, "version 7")
}

func TestOpenNotAnImage(t *testing.T) {
	parent := t.TempDir()

	missing := filepath.Join(parent, "missing")
	_, err := Open(context.Background(), missing)
	checkErr(t, err, ErrNotExist, missing, "does not exist")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %v does not match fs.ErrNotExist", err)
	}

	file := filepath.Join(parent, "file")
	must(t, os.WriteFile(file, []byte("x"), 0o600))
	_, err = Open(context.Background(), file)
	checkErr(t, err, ErrNotDir, file, "is not a directory")

	empty := filepath.Join(parent, "empty")
	must(t, os.Mkdir(empty, 0o700))
	_, err = Open(context.Background(), empty)
	checkErr(t, err, ErrEmpty, empty, "is empty: not a kcr image")

	other := filepath.Join(parent, "other")
	must(t, os.MkdirAll(filepath.Join(other, "criu"), 0o700))
	_, err = Open(context.Background(), other)
	checkErr(t, err, ErrNotImage, other, "manifest.json missing")
}

func TestOpenExtraFilesAndWarnings(t *testing.T) {
	dir := build(t)
	must(t, os.WriteFile(filepath.Join(dir, "criu/stats-restore"), []byte("r"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("n"), 0o600))
	must(t, os.Chmod(filepath.Join(dir, "criu/pages-1.img"), 0o644))
	im, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"criu/stats-restore", "notes.txt"}; !reflect.DeepEqual(im.Extra, want) {
		t.Errorf("Extra = %q, want %q", im.Extra, want)
	}
	if len(im.Warnings) != 1 || !strings.Contains(im.Warnings[0], "criu/pages-1.img mode 0644") ||
		!strings.Contains(im.Warnings[0], "chmod -R go-rwx") {
		t.Errorf("Warnings = %q", im.Warnings)
	}
}

func TestOpenCanceled(t *testing.T) {
	dir := build(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, dir); !errors.Is(err, context.Canceled) {
		t.Errorf("Open with canceled ctx: %v", err)
	}
}
