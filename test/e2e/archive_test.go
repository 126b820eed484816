package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// 9. checkpoint → export → image deleted → import elsewhere by a fresh kcr
// → restore: the app carries on.
func TestArchiveRoundTrip(t *testing.T) {
	echo, a := startEchoApp(t)
	c0, gen0, id0 := state(t, a.listen)
	img := checkpointGone(t, a.pid)

	arch := filepath.Join(t.TempDir(), "img.tar.zst")
	r := runKCR(t, kcrOpts{must: true}, "export", "--json", img, "-o", arch)
	var out struct {
		ImageBytes   int64 `json:"image_bytes"`
		ArchiveBytes int64 `json:"archive_bytes"`
		Files        int   `json:"files"`
		DurationNS   int64 `json:"duration_ns"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("kcr export --json: %v: %q", err, r.stdout)
	}
	fi, err := os.Stat(arch)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != out.ArchiveBytes {
		t.Fatalf("archive mode %04o size %d; want 0600 and the reported %d", fi.Mode().Perm(), fi.Size(), out.ArchiveBytes)
	}
	if out.ArchiveBytes >= out.ImageBytes || !strings.Contains(r.stderr, "archive") || !strings.Contains(r.stderr, "of the image") {
		t.Fatalf("export: archive %d bytes, image %d; stderr %q", out.ArchiveBytes, out.ImageBytes, r.stderr)
	}
	t.Logf("testapp image %d bytes in %d files, archive %d bytes (%.1f%%), export took %v",
		out.ImageBytes, out.Files, out.ArchiveBytes, 100*float64(out.ArchiveBytes)/float64(out.ImageBytes), time.Duration(out.DurationNS))

	// Only the archive travels.
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	imported := filepath.Join(t.TempDir(), "imported")
	r = runKCR(t, kcrOpts{must: true}, "import", arch, "-o", imported)
	if !strings.Contains(r.stderr, "imported") || !strings.Contains(r.stderr, "verified") {
		t.Fatalf("import stderr %q", r.stderr)
	}
	runKCR(t, kcrOpts{must: true}, "inspect", imported)

	n := len(a.events())
	accepts := echo.count()
	pid, res := restore(t, imported)
	if pid != a.pid || res["hooks_pending"] != false {
		t.Fatalf("restored PID %d (want %d), result %v", pid, a.pid, res)
	}
	evs := a.since(n)
	if got := names(evs, "after"); !slices.Equal(got, afterOrder) {
		t.Fatalf("after-restore order %v, want %v (events %v)", got, afterOrder, evs)
	}
	for _, e := range evs {
		if e["ev"] == "after" && e.str("kind") != "restore" {
			t.Fatalf("after-restore event %v: want kind restore", e)
		}
	}
	if echo.count() != accepts+1 {
		t.Fatalf("echo server saw %d new connections after restore, want 1", echo.count()-accepts)
	}
	checkRestoredState(t, a.listen, c0, gen0, id0)

	// Streaming: kcr export -o - | kcr import -.
	piped := filepath.Join(t.TempDir(), "piped")
	exp := kcrOpts{}.cmd("export", imported, "-o", "-")
	imp := kcrOpts{}.cmd("import", "-", "-o", piped)
	pr, pw := io.Pipe()
	var expErr, impErr bytes.Buffer
	exp.Stdout, exp.Stderr = pw, &expErr
	imp.Stdin, imp.Stderr = pr, &impErr
	if err := exp.Start(); err != nil {
		t.Fatal(err)
	}
	if err := imp.Start(); err != nil {
		t.Fatal(err)
	}
	eerr := exp.Wait()
	pw.Close()
	ierr := imp.Wait()
	if eerr != nil || ierr != nil {
		t.Fatalf("export | import: %v %q / %v %q", eerr, expErr.String(), ierr, impErr.String())
	}
	runKCR(t, kcrOpts{must: true}, "inspect", piped)
}

// 10. A tampered, a truncated and a path-escaping archive are each refused
// with one clear line and exit 5, leaving nothing behind.
func TestArchiveRefused(t *testing.T) {
	need(t)
	a := startApp(t)
	good := filepath.Join(t.TempDir(), "good")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", good, strconv.Itoa(a.pid))
	dir := t.TempDir()
	arch := filepath.Join(dir, "good.tar.zst")
	runKCR(t, kcrOpts{must: true}, "export", good, "-o", arch)
	data, err := os.ReadFile(arch)
	if err != nil {
		t.Fatal(err)
	}
	raw := imagetest.Unzstd(t, data)

	// Tampered: one byte of a pages file's payload flipped in the tar
	// stream, recompressed: valid zstd, wrong sha256.
	pages := ""
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		if strings.HasPrefix(filepath.Base(hdr.Name), "pages-") && hdr.Size > 200 {
			pages = hdr.Name
			break
		}
	}
	at := bytes.Index(raw, []byte(pages+"\x00"))
	if pages == "" || at < 0 || at%512 != 0 {
		t.Fatalf("no pages file header in the archive (%q at %d)", pages, at)
	}
	tampered := bytes.Clone(raw)
	tampered[at+512+100] ^= 0xff

	// Path escape: an extra "../evil" entry right after the manifest.
	ents := imagetest.ReadTar(t, raw)
	evil := imagetest.Entry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "../evil", Size: 5, Mode: 0o600}, Data: []byte("pwned")}
	esc := imagetest.Zstd(t, imagetest.Tar(t, append([]imagetest.Entry{ents[0], evil}, ents[1:]...)))

	cases := []struct {
		name string
		data []byte
		want []string
	}{
		{"tampered", imagetest.Zstd(t, tampered), []string{pages + " is corrupt: sha256 mismatch", "export the image again"}},
		{"truncated", data[:len(data)/2], []string{"archive is truncated", "copy it again"}},
		{"escape", esc, []string{`"../evil"`, "refusing to write outside the image"}},
	}
	for _, c := range cases {
		file := filepath.Join(dir, c.name+".tar.zst")
		if err := os.WriteFile(file, c.data, 0o600); err != nil {
			t.Fatal(err)
		}
		parent := t.TempDir()
		r := runKCR(t, kcrOpts{log: logAll}, "import", file, "-o", filepath.Join(parent, "img"))
		if r.code != 5 {
			t.Errorf("%s: exit %d, want 5 (stderr %q)", c.name, r.code, r.stderr)
		}
		for _, w := range append(c.want, file) {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr %q lacks %q", c.name, r.stderr, w)
			}
		}
		if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
			t.Errorf("%s: error spans %d lines, want one", c.name, n+1)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 0 {
			t.Errorf("%s: refused import left %v behind", c.name, ents)
		}
		for _, p := range []string{filepath.Join(parent, "evil"), filepath.Join(filepath.Dir(parent), "evil")} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s: %s written outside the image", c.name, p)
			}
		}
	}

	// The intact archive still imports, and not over a non-empty directory.
	dest := t.TempDir()
	os.WriteFile(filepath.Join(dest, "precious"), []byte("keep"), 0o600)
	if r := runKCR(t, kcrOpts{log: logAll}, "import", arch, "-o", dest); r.code != 5 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("import over a non-empty directory: exit %d %q; want 5, already exists", r.code, r.stderr)
	}
	runKCR(t, kcrOpts{must: true}, "import", arch, "-o", filepath.Join(t.TempDir(), "ok"))
}
