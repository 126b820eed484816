package images

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A checkpoint whose kcr died after the dump leaves its temporary directory
// with the draft manifest: Recover publishes a complete, verified image.
func TestRecoverAfterDump(t *testing.T) {
	b := pendingDump(t)
	final := b.Final()
	if got := FindPending(filepath.Dir(final)); len(got) != 1 || got[0] != b.Dir() {
		t.Fatalf("FindPending = %v, want [%s]", got, b.Dir())
	}
	if _, err := Open(context.Background(), final); err == nil {
		t.Fatal("the unpublished image opens")
	}
	img, err := Recover(context.Background(), b.Dir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Dir != final {
		t.Fatalf("recovered to %s, want %s", img.Dir, final)
	}
	got, err := Open(context.Background(), final)
	if err != nil {
		t.Fatalf("recovered image does not verify: %v", err)
	}
	if got.Manifest.Process.PID != 42 || len(got.Manifest.Files) != len(testFiles) {
		t.Fatalf("manifest %+v", got.Manifest)
	}
	if _, err := os.Stat(filepath.Join(final, PendingName)); err == nil {
		t.Fatal("the draft manifest was published")
	}
	if _, err := os.Stat(b.Dir()); err == nil {
		t.Fatal("the temporary directory is still there")
	}
}

// A dump that did not finish (no stats-dump: CRIU resumed the app or was
// killed) is refused, and left for the user to remove.
func TestRecoverUnfinishedDump(t *testing.T) {
	b := pendingDump(t)
	final := b.Final()
	os.Remove(filepath.Join(b.CRIUDir(), CRIUDoneName))
	if _, err := Recover(context.Background(), b.Dir(), nil); !errors.Is(err, ErrNotRecoverable) {
		t.Fatalf("Recover = %v, want ErrNotRecoverable", err)
	}
	if FindPending(filepath.Dir(final)) != nil {
		t.Fatal("FindPending lists an unfinished dump")
	}
	if _, err := Recover(context.Background(), final, nil); !errors.Is(err, ErrNotRecoverable) {
		t.Fatalf("Recover of a non-temporary path = %v", err)
	}
}

// kcr died after writing the manifest, before the rename: Recover renames.
func TestRecoverAfterManifest(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	b, err := Create(final)
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	files, _, err := b.seal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := testManifest()
	m.Format, m.FormatVersion, m.Files = Format, FormatVersion, files
	if err := b.writeManifest(m); err != nil {
		t.Fatal(err)
	}
	// kcr standby finds it to recover on its start.
	if got := FindPending(filepath.Dir(final)); len(got) != 1 || got[0] != b.Dir() {
		t.Fatalf("FindPending = %v, want [%s]", got, b.Dir())
	}
	if _, err := Recover(context.Background(), b.Dir(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), final); err != nil {
		t.Fatal(err)
	}
}

// pendingDump leaves the temporary directory of a checkpoint whose kcr died
// after CRIU's dump, with its draft manifest.
func pendingDump(t *testing.T) *Builder {
	t.Helper()
	b, err := Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	writeDump(t, b.CRIUDir())
	must(t, b.WritePending(testManifest()))
	return b
}
