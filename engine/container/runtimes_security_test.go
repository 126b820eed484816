package container

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/kcr-dev/kcr/images/oci"
)

// TestSecurityArchiveAnnotationSmuggling: the shape of the 2026 containerd
// advisory GHSA-33vj-92qq-66hc (annotations in a checkpoint archive that a
// restore trusts over the local configuration). Restoring kcr's archive
// without --bundle builds the spec from the archive: a CDI annotation, or an
// org.criu.config that is not root's own configuration (CRIU runs its
// action scripts as root), is refused before runc runs; root's own
// configuration, as kcr install-runtime-hook writes it, is accepted.
func TestSecurityArchiveAnnotationSmuggling(t *testing.T) {
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	os.Mkdir(rootfs, 0o755)
	own := filepath.Join(dir, "criu.conf")
	os.WriteFile(own, []byte("action-script /usr/local/bin/kcr-criu-hook\n"), 0o644)
	writable := filepath.Join(dir, "writable.conf")
	os.WriteFile(writable, []byte("action-script /tmp/evil\n"), 0o644)
	os.Chmod(writable, 0o666)
	link := filepath.Join(dir, "link.conf")
	os.Symlink(own, link)
	for _, tc := range []struct {
		name string
		ann  map[string]any
		ok   bool
	}{
		{"root's own CRIU configuration", map[string]any{"org.criu.config": own}, true},
		{"no annotation", nil, true},
		{"CDI device", map[string]any{"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}, false},
		{"CRIU configuration others may write", map[string]any{"org.criu.config": writable}, false},
		{"CRIU configuration through a symlink", map[string]any{"org.criu.config": link}, false},
		{"relative CRIU configuration", map[string]any{"org.criu.config": "criu.conf"}, false},
		{"missing CRIU configuration", map[string]any{"org.criu.config": filepath.Join(dir, "none.conf")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := t.TempDir()
			spec := map[string]any{"root": map[string]any{"path": rootfs}, "annotations": tc.ann}
			b, _ := json.Marshal(spec)
			os.WriteFile(filepath.Join(img, containerSpecFile), b, 0o600)
			dst := filepath.Join(t.TempDir(), "bundle")
			_, err := buildBundle(img, dir, dst)
			if tc.ok && err != nil {
				t.Fatalf("buildBundle: %v", err)
			}
			if !tc.ok {
				if !errors.Is(err, ErrUnsafeSpec) || !strings.Contains(err.Error(), "--bundle") {
					t.Fatalf("buildBundle: %v, want ErrUnsafeSpec naming --bundle", err)
				}
				if _, err := os.Stat(dst); err == nil {
					t.Error("a bundle was written for a refused spec")
				}
			}
		})
	}
}

// TestSecurityOCILayoutTagPoisoning: the shape of the 2026 containerd
// advisory GHSA-cvxm-645q-p574 (a checkpoint import that re-tags a local
// image). kcr tags nothing; its restore of an OCI layout takes exactly the
// one checkpoint image of kcr export --format oci, and refuses a layout that
// also carries an image named like a local one, before unpacking anything.
func TestSecurityOCILayoutTagPoisoning(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	ck, _ := random.Image(64, 1)
	ck = mutate.Annotations(ck, map[string]string{oci.CheckpointAnnotation: "svc"}).(v1.Image)
	evil, _ := random.Image(64, 1)
	if err := p.AppendImage(ck); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(evil, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "docker.io/library/busybox:latest"})); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	_, err = RestoreContainer(context.Background(), RestoreOptions{Target: Target{ID: "svc", Runtime: "/nonexistent/runc"}, Image: dir})
	if err == nil || !strings.Contains(err.Error(), "holds 2 images") {
		t.Fatalf("restore of a layout with a second, tagged image: %v; want it refused (holds 2 images)", err)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("a refused layout left %d entries in TMPDIR", len(ents))
	}
}
