package images

import (
	"path/filepath"
	"testing"
)

// The interrupted checkpoint of an image is found by the image's own name
// (kcr checkpoint's -o), not only by its directory; another image's is not.
func TestFindPendingOf(t *testing.T) {
	b := pendingDump(t)
	final := b.Final()
	if got := FindPendingOf(final); len(got) != 1 || got[0] != b.Dir() {
		t.Fatalf("FindPendingOf(%s) = %v, want [%s]", final, got, b.Dir())
	}
	if got := FindPendingOf(final + "/"); len(got) != 1 {
		t.Fatalf("FindPendingOf with a trailing slash = %v", got)
	}
	if got := FindPendingOf(filepath.Join(filepath.Dir(final), "other")); len(got) != 0 {
		t.Fatalf("FindPendingOf another name = %v, want none", got)
	}
}
