package images

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestSecurityCacheNotWrittenThroughLinks: root verifying an image of
// another uid, which planted verified.tmp as a link to a file of root's,
// must not write through it; nor in its own image.
func TestSecurityCacheNotWrittenThroughLinks(t *testing.T) {
	imagetest.NeedRoot(t)
	noQuiet(t)
	for _, owner := range []int{imagetest.OtherUID, 0} {
		img := build(t)
		precious := filepath.Join(t.TempDir(), "precious")
		if err := os.WriteFile(precious, []byte("root's\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(img, VerifiedName))
		if err := os.Symlink(precious, filepath.Join(img, verifiedTmp)); err != nil {
			t.Fatal(err)
		}
		imagetest.ChownAll(t, img, owner)
		if _, err := Open(context.Background(), img); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(precious); string(b) != "root's\n" {
			t.Fatalf("image of uid %d: root wrote %q through verified.tmp", owner, b)
		}
		_, err := os.Lstat(filepath.Join(img, VerifiedName))
		if owner != 0 && err == nil {
			t.Errorf("a cache was written into the image of uid %d", owner)
		}
		if owner == 0 && err != nil {
			t.Errorf("no cache in root's own image: %v", err)
		}
	}
}

// TestSecurityUntrustedImageRefused: as root, with Trusted, an image that
// another uid owns or could write is refused, naming what and the fix.
func TestSecurityUntrustedImageRefused(t *testing.T) {
	imagetest.NeedRoot(t)
	ctx := context.Background()
	trusted := OpenOptions{Trusted: true}
	img := build(t)
	im, err := OpenWith(ctx, img, trusted)
	if err != nil {
		t.Fatalf("root's own image: %v", err)
	}
	im.Close()

	for name, spoil := range map[string]func(img string){
		"dir of another uid": func(img string) { os.Chown(img, imagetest.OtherUID, imagetest.OtherUID) },
		"file of another uid": func(img string) {
			os.Chown(filepath.Join(img, "criu", "core-1.img"), imagetest.OtherUID, imagetest.OtherUID)
		},
		"group-writable file":   func(img string) { os.Chmod(filepath.Join(img, "criu", "pages-1.img"), 0o620) },
		"world-writable parent": func(img string) { os.Chmod(filepath.Dir(img), 0o777) },
		"parent of another uid": func(img string) { os.Chown(filepath.Dir(img), imagetest.OtherUID, imagetest.OtherUID) },
	} {
		img := build(t)
		spoil(img)
		_, err := OpenWith(ctx, img, trusted)
		if !errors.Is(err, ErrUntrusted) {
			t.Errorf("%s: %v, want ErrUntrusted", name, err)
			continue
		}
		if im, err := Open(ctx, img); err != nil {
			t.Errorf("%s: without Trusted: %v", name, err)
		} else {
			im.Close()
		}
	}
	// A sticky parent of root's, like /tmp, is fine.
	img = build(t)
	os.Chmod(filepath.Dir(img), os.ModeSticky|0o777)
	if im, err := OpenWith(ctx, img, trusted); err != nil {
		t.Errorf("image under a sticky directory: %v", err)
	} else {
		im.Close()
	}
}

// TestSecurityRecoverUntrusted: root does not publish, nor sign, the
// unfinished checkpoint directory of another uid, or one that others can
// write: that uid chose its content.
func TestSecurityRecoverUntrusted(t *testing.T) {
	imagetest.NeedRoot(t)
	priv, _ := testKey(t)
	for name, spoil := range map[string]func(tmp string){
		"dir of another uid": func(tmp string) { imagetest.ChownAll(t, tmp, imagetest.OtherUID) },
		"file of another uid": func(tmp string) {
			os.Lchown(filepath.Join(tmp, "criu", "core-1.img"), imagetest.OtherUID, imagetest.OtherUID)
		},
		"group-writable dir": func(tmp string) { os.Chmod(filepath.Join(tmp, "criu"), 0o770) },
	} {
		b := pendingDump(t)
		final := b.Final()
		spoil(b.Dir())
		_, err := Recover(context.Background(), b.Dir(), priv)
		if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "kcr recover") {
			t.Errorf("%s: %v, want ErrUntrusted", name, err)
		}
		if _, err := os.Lstat(final); err == nil {
			t.Errorf("%s: the image was published", name)
		}
	}
}
