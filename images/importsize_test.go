package images

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestImportSizeLimit: an archive whose image is above the limit is refused
// before anything is unpacked, naming the flag that raises the limit.
func TestImportSizeLimit(t *testing.T) {
	data := exportBytes(t, build(t))
	parent := t.TempDir()
	_, err := Import(context.Background(), bytes.NewReader(data), filepath.Join(parent, "img"), WithMaxSize(10))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "--max-size") {
		t.Errorf("Import above the limit: %v", err)
	}
	nothingLeft(t, parent)
	if _, err := Import(context.Background(), bytes.NewReader(data), filepath.Join(parent, "img")); err != nil {
		t.Errorf("Import under the default limit: %v", err)
	}
}

// TestImportNoSpace: a manifest that lists more bytes than the destination
// has free is refused before anything is unpacked, whatever the limit (a
// small zstd archive can declare and expand to any size).
func TestImportNoSpace(t *testing.T) {
	good := imageEntries(t, build(t))
	var m map[string]any
	must(t, json.Unmarshal(good[0].Data, &m))
	m["files"].([]any)[0].(map[string]any)["size"] = int64(1) << 55
	b, err := json.Marshal(m)
	must(t, err)
	entries := append([]entry{regEntry(ManifestName, b)}, good[1:]...)
	parent := t.TempDir()
	_, err = Import(context.Background(), bytes.NewReader(imagetest.Archive(t, entries)), filepath.Join(parent, "img"), WithMaxSize(math.MaxInt64))
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "free") {
		t.Errorf("Import larger than the free space: %v", err)
	}
	nothingLeft(t, parent)
}

// TestImportRemovesKilledImports: the next import removes the temporary
// directory of an import that was killed, but neither a live import's
// (locked) nor a checkpoint's (unmarked: "kcr recover" may need it).
func TestImportRemovesKilledImports(t *testing.T) {
	data := exportBytes(t, build(t))
	parent := t.TempDir()
	mk := func(name string, mark bool) string {
		d := filepath.Join(parent, name)
		must(t, os.Mkdir(d, 0o700))
		if mark {
			must(t, os.WriteFile(filepath.Join(d, importMark), nil, 0o600))
		}
		return d
	}
	killed := mk(".a"+tmpMarker+"111", true)
	live := mk(".b"+tmpMarker+"222", false)
	l, err := lockImport(live)
	must(t, err)
	defer l.Close()
	ckpt := mk(".c"+tmpMarker+"333", false)
	if _, err := Import(context.Background(), bytes.NewReader(data), filepath.Join(parent, "img")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(killed); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("killed import's directory kept: %v", err)
	}
	for _, d := range []string{live, ckpt} {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(parent, "img", importMark)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("import mark left in the image: %v", err)
	}
}
