package standby

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// entriesIn lists the entries of dir whose names start with prefix.
func entriesIn(t *testing.T, dir, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// writeBad makes a bad image with some content, as setAside leaves one.
func writeBad(t *testing.T, dir, name string) {
	t.Helper()
	writeImage(t, dir, name)
	if err := os.WriteFile(filepath.Join(dir, name, "pages-1.img"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
}

// pruneBad keeps the newest images set aside (by the time they were set
// aside, then by number), removes the others and what a cut-short removal
// left, unlinks a symlink without touching its target, and leaves
// everything else alone.
func TestPruneBad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	for _, n := range []string{"bad-img-000001-100", "bad-img-000002-200", "bad-img-000003-200", "bad-img-000004-50"} {
		writeBad(t, dir, n)
	}
	writeBad(t, dir, ".bad-img-000000-1"+removingMarker) // a removal cut short
	writeImage(t, dir, imageName(6))
	if err := os.WriteFile(filepath.Join(dir, "bad-notes"), []byte("not an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep-me"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "bad-img-000005-10")); err != nil {
		t.Fatal(err)
	}

	removed, err := d.pruneBad(2)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{"bad-img-000001-100", "bad-img-000004-50", "bad-img-000005-10"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	if got, want := entriesIn(t, dir, badPrefix), []string{"bad-img-000002-200", "bad-img-000003-200", "bad-notes"}; !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
	if got := entriesIn(t, dir, "."); len(got) != 0 {
		t.Errorf("hidden entries left: %v", got)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep-me")); err != nil {
		t.Errorf("the symlink's target was touched: %v", err)
	}
	if got := entriesIn(t, dir, imagePrefix); !slices.Equal(got, []string{imageName(6)}) {
		t.Errorf("images %v, want %s untouched", got, imageName(6))
	}
	// The next image is still numbered past every bad one kept.
	if n, _ := d.nextImage(); n != imageName(7) {
		t.Errorf("next image %s, want %s", n, imageName(7))
	}

	if _, err := d.pruneBad(-1); err != nil {
		t.Fatal(err)
	}
	if got := entriesIn(t, dir, badPrefix); !slices.Equal(got, []string{"bad-notes"}) {
		t.Errorf("keep none: left %v", got)
	}
}

// A directory another uid owns is never removed, and the error names it.
func TestPruneBadForeignOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another uid")
	}
	dir := filepath.Join(t.TempDir(), "img")
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	writeBad(t, dir, "bad-img-000001-100")
	writeBad(t, dir, "bad-img-000002-200")
	if err := os.Chown(filepath.Join(dir, "bad-img-000001-100"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	removed, err := d.pruneBad(1)
	if err == nil || !strings.Contains(err.Error(), "bad-img-000001-100") || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("error %v, want one naming bad-img-000001-100 and its owner", err)
	}
	if len(removed) != 0 {
		t.Errorf("removed %v", removed)
	}
	if got := entriesIn(t, dir, badPrefix); len(got) != 2 {
		t.Errorf("left %v, want both", got)
	}
}

// Failed restores leave at most KeepBad images set aside: the newest.
func TestRestoreFailsKeepsNewestBad(t *testing.T) {
	f := newFake()
	f.failRestore[imageName(1)] = true
	f.failRestore[imageName(2)] = true
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) { o.KeepBad = 1 })
	for i := 2; i <= 3; i++ {
		r.waitState(StateStandby)
		r.s.Wake("manual")
		if !wait.Until(30*time.Second, func() bool { starts, _, _ := f.snapshot(); return starts == i }) {
			t.Fatalf("no cold start %d after a failed restore; log:\n%s", i, r.log.String())
		}
	}
	r.waitState(StateStandby)
	r.end()
	bad := entriesIn(t, r.dir, badPrefix)
	if len(bad) != 1 || !strings.HasPrefix(bad[0], badPrefix+imageName(2)+"-") {
		t.Fatalf("images set aside %v, want only the newest (%s)", bad, imageName(2))
	}
	if !strings.Contains(r.log.String(), "removed older images set aside") {
		t.Errorf("the removal is not logged:\n%s", r.log.String())
	}
}

// A kcr standby killed while it wrote its state file leaves the file's
// temporary: the next one removes it, and keeps the state file.
func TestOpenImageDirRemovesStateTemps(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.writeState(persisted{State: StateStandby}); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(dir, "."+stateFileName+"-123456")
	if err := os.WriteFile(left, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.close()
	d, err = openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	if got := entriesIn(t, dir, "."+stateFileName+"-"); len(got) != 0 {
		t.Errorf("state temporaries left: %v", got)
	}
	if p, err := d.readState(); err != nil || p.State != StateStandby {
		t.Errorf("state file after the reopen: %+v, %v", p, err)
	}
}

// A failed restore's work directory goes into its bad image aside; those of
// restores a killed kcr standby left are swept, and nothing else is.
func TestRestoreWorkKeptAndSwept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	name := imageName(3)
	writeImage(t, dir, name)
	work := restoreWorkDir(dir, name)
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "restore.log"), []byte("Error (criu/files-reg.c:2353): ...\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	aside, err := d.setAside(name)
	if err != nil {
		t.Fatal(err)
	}
	log := d.keepRestoreLog(name, aside)
	if b, err := os.ReadFile(log); err != nil || !strings.Contains(string(b), "Error") {
		t.Fatalf("restore log %q in the bad image: %q, %v", log, b, err)
	}
	if _, err := os.Stat(work); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the work directory stayed: %v", err)
	}
	if got := d.keepRestoreLog(imageName(4), aside); got != "" {
		t.Fatalf("keepRestoreLog without a work directory: %q, want \"\"", got)
	}
	// A restore that failed before CRIU ran: no log, nothing kept.
	empty := restoreWorkDir(dir, imageName(4))
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	if got := d.keepRestoreLog(imageName(4), aside); got != "" {
		t.Fatalf("keepRestoreLog of a work directory without a log: %q, want \"\"", got)
	}
	if _, err := os.Stat(empty); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the empty work directory stayed: %v", err)
	}

	left := restoreWorkDir(dir, imageName(5)) // a killed kcr standby's
	if err := os.MkdirAll(filepath.Join(left, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "restore-notes") // not a restore's
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.sweepRestoreWork(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the left work directory was not swept: %v", err)
	}
	for _, keep := range []string{other, filepath.Join(dir, aside, restoreLogDir)} {
		if _, err := os.Stat(keep); err != nil {
			t.Fatalf("%s was removed: %v", keep, err)
		}
	}
}
