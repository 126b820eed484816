package images

import (
	"archive/tar"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestSecurityCRIOSymlinkedHostFile: the shape of the 2026 containerd
// advisory GHSA-rgh6-rfwx-v388 (a checkpoint archive's container.log a
// symlink to a host file, read back through "kubectl logs"): kcr's import
// of a CRI-O archive refuses a symlink or hard link anywhere in it, CRI-O's
// own files included, and leaves nothing behind.
func TestSecurityCRIOSymlinkedHostFile(t *testing.T) {
	good := crioEntries(t, build(t))
	link := func(name string, typ byte) entry {
		return entry{Hdr: tar.Header{Typeflag: typ, Name: name, Linkname: "/etc/shadow", Mode: 0o777}}
	}
	for _, tc := range []struct {
		name string
		e    entry
	}{
		{"container.log symlink", link("container.log", tar.TypeSymlink)},
		{"spec.dump symlink", link("spec.dump", tar.TypeSymlink)},
		{"CRIU file symlink", link("checkpoint/pages-9.img", tar.TypeSymlink)},
		{"hard link", link("checkpoint/pages-9.img", tar.TypeLink)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entries := append([]entry{tc.e}, good...)
			parent := t.TempDir()
			_, err := ImportCRIOFile(context.Background(), writeFile(t, imagetest.Tar(t, entries)), filepath.Join(parent, "img"))
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("import of an archive with %s: %v, want ErrUnsafePath", tc.name, err)
			}
			nothingLeft(t, parent)
		})
	}
}
