package notify_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/notify"
)

// TestSecuritySocketDirOfAnotherUser: a socket directory that another uid
// created (or left open to others) is refused, so that it cannot put its
// own control socket in the app's place.
func TestSecuritySocketDirOfAnotherUser(t *testing.T) {
	imagetest.NeedRootTo(t, "create a directory of another uid")
	const other = 61001
	base := t.TempDir()
	planted := filepath.Join(base, "kcr-planted")
	if err := os.Mkdir(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(planted, 0o777)
	if err := os.Chown(planted, other, other); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(base, "kcr-theirs")
	os.Mkdir(private, 0o700)
	os.Chown(private, other, other)
	open := filepath.Join(base, "kcr-open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o775)
	link := filepath.Join(base, "kcr-link")
	os.Symlink(planted, link)
	quiet := notify.WithLogger(slog.New(slog.DiscardHandler))
	for _, tc := range []struct{ dir, want string }{
		{planted, "belongs to uid 61001"},
		{private, "belongs to uid 61001"},
		{open, "chmod 700"},
		{link, "not a directory"},
	} {
		s, err := notify.NewRegistry().Start(notify.WithSocketDir(tc.dir), quiet)
		if err == nil {
			s.Close()
			t.Errorf("Start in %s succeeded", tc.dir)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start in %s: %v, want %q", tc.dir, err, tc.want)
		}
		s, err = notify.NewRegistry().Start(notify.WithSocketPath(filepath.Join(tc.dir, "kcr-x.sock")), quiet)
		if err == nil {
			s.Close()
			t.Errorf("Start at a path in %s succeeded", tc.dir)
		}
	}
	if _, err := notify.NewRegistry().Start(notify.WithSocketPath(filepath.Join(t.TempDir(), "kcr-a\nb.sock")), quiet); err == nil || !strings.Contains(err.Error(), "control character") {
		t.Errorf("path with a newline: %v", err)
	}
}
