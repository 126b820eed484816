package container

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest/containerimg"
	"github.com/kcr-dev/kcr/notify/proto"
)

// The action script's reports say which hooks failed: a HookError with
// their reports (a carry veto among them stays one), nil if none failed.
func TestFailedHooks(t *testing.T) {
	dir := t.TempDir()
	write := func(res criuaction.Result) string {
		b, _ := json.Marshal(res)
		p := filepath.Join(dir, criuaction.ReportsFile)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if he := failedHooks(filepath.Join(dir, "none")); he != nil {
		t.Errorf("no reports file: %v", he)
	}
	ok := criuaction.Target{PID: 1, Reports: []proto.HookReport{{Name: "db"}}}
	if he := failedHooks(write(criuaction.Result{Targets: []criuaction.Target{ok}})); he != nil {
		t.Errorf("no failed target: %v", he)
	}
	bad := criuaction.Target{PID: 7, Error: "hook failing: no", Reports: []proto.HookReport{{Name: "failing", Error: "failing: no"}}}
	he := failedHooks(write(criuaction.Result{Targets: []criuaction.Target{ok, bad}}))
	if he == nil || he.CarryVeto() || !strings.Contains(he.Error(), "failing: no") || !strings.Contains(he.Msg, "PID 7") {
		t.Errorf("failed target: %#v", he)
	}
	veto := criuaction.Target{PID: 8, Error: "would carry 3 records", Reports: []proto.HookReport{{Name: "w", Error: "would carry 3 records", CarryVeto: true}}}
	if he := failedHooks(write(criuaction.Result{Targets: []criuaction.Target{veto}})); he == nil || !he.CarryVeto() {
		t.Errorf("carry veto: %#v", he)
	}
}

// TestSecurityContainerRestoreUntrusted: as root, kcr restore --container
// refuses an image another uid owns before runc is run, as kcr restore
// does (it used to open it without the check).
func TestSecurityContainerRestoreUntrusted(t *testing.T) {
	imagetest.NeedRootTo(t, "make a directory of another uid")
	img := containerimg.Write(t, containerimg.Options{Bundle: "/nonexistent"})
	imagetest.ChownAll(t, img, imagetest.OtherUID)
	ran := filepath.Join(t.TempDir(), "ran")
	runtime := filepath.Join(t.TempDir(), "runc")
	os.WriteFile(runtime, []byte("#!/bin/sh\ntouch "+ran+"\nexit 1\n"), 0o700)
	_, err := RestoreContainer(context.Background(), RestoreOptions{Target: Target{ID: "c", Runtime: runtime}, Image: img})
	if !errors.Is(err, images.ErrUntrusted) {
		t.Fatalf("restore --container of uid 61001's image: %v, want ErrUntrusted", err)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("runc was run for an untrusted image")
	}
	if _, err := RestoreContainer(context.Background(), RestoreOptions{Target: Target{ID: "c", Runtime: runtime}, Image: img, AllowUntrusted: true}); errors.Is(err, images.ErrUntrusted) {
		t.Errorf("AllowUntrusted: still refused: %v", err)
	}
}

// TestExportArchiveCarriesSignature: the CRI-O archive of a signed
// container image holds the manifest and its signature as they are in the
// image, and CRIU's files as the manifest lists them.
func TestExportArchiveCarriesSignature(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "k")
	if _, err := images.GenerateKeyFiles(prefix, ""); err != nil {
		t.Fatal(err)
	}
	key, err := images.LoadPrivateKey(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	img := containerimg.Write(t, containerimg.Options{Key: key})
	out := filepath.Join(dir, "c.tar")
	if _, err := Export(context.Background(), ExportOptions{Image: img, Format: FormatCRIO, Output: out}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[hdr.Name], _ = io.ReadAll(tr)
	}
	for name, file := range map[string]string{
		"kcr-manifest.json": images.ManifestName, images.CRIOSignatureName: images.SignatureName,
		"checkpoint/pages-1.img": "criu/pages-1.img", "checkpoint/inventory.img": "criu/inventory.img",
	} {
		want, _ := os.ReadFile(filepath.Join(img, file))
		if !bytes.Equal(got[name], want) || len(want) == 0 {
			t.Errorf("archive entry %s: %d bytes, want the image's %s (%d bytes)", name, len(got[name]), file, len(want))
		}
	}
}
