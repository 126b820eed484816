package engine

// Root-kcr against a second uid (docs/security-paths.md). Each test keeps the
// shape of the attack that the review reproduced.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestSecurityRunLogParentLink (finding 5 of docs/security-paths.md): kcr run --log U/logs/secret.txt,
// U being uid 61001's directory and logs its link to a root-only
// directory, must not append the service's output to root's file.
func TestSecurityRunLogParentLink(t *testing.T) {
	imagetest.NeedRoot(t)
	u, secret := imagetest.LinkedDir(t)
	_, err := Run(context.Background(), RunOptions{Args: []string{"echo", "appended"}, Log: filepath.Join(u, "logs", "secret.txt")})
	if !errors.Is(err, images.ErrUntrusted) || !strings.Contains(err.Error(), "61001") {
		t.Errorf("kcr run --log through uid 61001's link: %v; want ErrUntrusted naming uid 61001", err)
	}
	time.Sleep(200 * time.Millisecond) // the service, if started, writes
	if b, _ := os.ReadFile(secret); string(b) != "root's\n" {
		t.Errorf("root's file was written through the link: %q", b)
	}
}
