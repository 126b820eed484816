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

// Options shape the image Write makes; the zero value is an unsigned image
// in a temporary directory, of a container whose bundle holds a
// config.json.
type Options struct {
	Dir    string             // the image's directory, not there yet (default: in a temporary directory)
	Bundle string             // the bundle container.json names (default: a new one)
	Files  map[string]string  // more files beside the manifest: name, content
	Key    ed25519.PrivateKey // signs the image when not nil
}

// Write writes what kcr checkpoint --container writes for runc container
// "c": a small dump and container.json beside the manifest, naming the
// bundle. It returns the image's directory.
func Write(t testing.TB, o Options) string {
	t.Helper()
	img := o.Dir
	if img == "" {
		img = filepath.Join(t.TempDir(), "img")
	}
	bundle := o.Bundle
	if bundle == "" {
		bundle = filepath.Join(t.TempDir(), "bundle")
		os.Mkdir(bundle, 0o700)
		os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o600)
	}
	b, err := images.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	os.WriteFile(filepath.Join(b.CRIUDir(), "inventory.img"), []byte("inv"), 0o600)
	os.WriteFile(filepath.Join(b.CRIUDir(), "pages-1.img"), bytes.Repeat([]byte{7}, 5000), 0o600)
	os.WriteFile(filepath.Join(b.Dir(), "container.json"), []byte(`{"id":"c","bundle":"`+bundle+`"}`), 0o600)
	for name, content := range o.Files {
		os.WriteFile(filepath.Join(b.Dir(), name), []byte(content), 0o600)
	}
	if o.Key != nil {
		b.SignWith(o.Key)
	}
	if _, err := b.Commit(context.Background(), &images.Manifest{}); err != nil {
		t.Fatal(err)
	}
	return img
}
