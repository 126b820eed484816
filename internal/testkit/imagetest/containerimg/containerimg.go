// Package containerimg writes small kcr images of a runc container for
// tests. It stands apart from imagetest because it builds with package
// images, whose own tests import imagetest.
package containerimg

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"testing"

	"github.com/kcr-dev/kcr/images"
)

// Write writes what kcr checkpoint --container writes for runc container
// "c": a small image with container.json beside the manifest, naming a
// bundle that holds a config.json; signed by key if not nil. It returns the
// image's directory.
func Write(t testing.TB, key ed25519.PrivateKey) string {
	t.Helper()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle")
	os.Mkdir(bundle, 0o700)
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o600)
	img := filepath.Join(dir, "img")
	b, err := images.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	os.WriteFile(filepath.Join(b.CRIUDir(), "inventory.img"), []byte("inv"), 0o600)
	os.WriteFile(filepath.Join(b.CRIUDir(), "pages-1.img"), bytes.Repeat([]byte{7}, 5000), 0o600)
	os.WriteFile(filepath.Join(b.Dir(), "container.json"), []byte(`{"id":"c","bundle":"`+bundle+`"}`), 0o600)
	if key != nil {
		b.SignWith(key)
	}
	if _, err := b.Commit(context.Background(), &images.Manifest{}); err != nil {
		t.Fatal(err)
	}
	return img
}
