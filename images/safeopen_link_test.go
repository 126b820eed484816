package images

import (
	"os"
	"path/filepath"
	"testing"
)

// A link whose target ends in a slash, or holds two in a row, names the
// same directory as without them ("ln -s /var/lib/kcr/ images"): the walk
// goes on from that directory, not from "/".
func TestOpenDirLinkTargetSlashes(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.MkdirAll(filepath.Join(real, "img"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"abs-trailing": real + "/",
		"abs-double":   base + "//real",
		"rel-trailing": "real/",
		"rel-double":   ".//real//",
	} {
		link := filepath.Join(base, name)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		f, walked, err := openDir(filepath.Join(link, "img"), false, "")
		if err != nil {
			t.Errorf("%s → %q: %v", name, target, err)
			continue
		}
		f.Close()
		if want := filepath.Join(real, "img"); walked != want {
			t.Errorf("%s → %q: walked %s, want %s", name, target, walked, want)
		}
	}
}
