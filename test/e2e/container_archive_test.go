package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
)

// TestContainerRestoreFromArchive: a CRI-O checkpoint archive of "kcr
// export --format cri-o" of a signed image, with the image deleted,
// restores as a new container (its signature checked; another key is
// refused), and so does the OCI image layout of "kcr export --format oci":
// the hooks run as a restore with a new identity, no acked record is
// missing on the broker, and of kcr's temporary directories only the
// bundle runc uses is left. A restore that fails (onto the running copy's
// id) keeps CRIU's work directory and names it.
func TestContainerRestoreFromArchive(t *testing.T) {
	topic, c := producingContainer(t, "kcr-ctr-archive", "-client-id", "ctr-archive")
	before := c.state()

	keys := filepath.Join(t.TempDir(), "ops")
	runKCR(t, kcrOpts{must: true}, "keygen", "-o", keys)
	other := filepath.Join(t.TempDir(), "other")
	runKCR(t, kcrOpts{must: true}, "keygen", "-o", other)
	img := filepath.Join(t.TempDir(), "img")
	runKCR(t, kcrOpts{must: true}, "checkpoint", "--container", c.id, "--runc-root", c.root, "--sign", keys+".key", "-o", img)
	archive := filepath.Join(t.TempDir(), "checkpoint.tar")
	oci := filepath.Join(t.TempDir(), "oci")
	// Every format reports what it read and wrote (cri-o and oci said 0).
	for _, e := range []struct{ format, out string }{{"cri-o", archive}, {"oci", oci}} {
		r := runKCR(t, kcrOpts{must: true}, "export", "--json", "--format", e.format, "-o", e.out, img)
		var res struct {
			ImageBytes   int64 `json:"image_bytes"`
			ArchiveBytes int64 `json:"archive_bytes"`
			Files        int   `json:"files"`
			DurationNS   int64 `json:"duration_ns"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("kcr export --format %s --json: %v: %q", e.format, err, r.stdout)
		}
		if written := imagetest.TreeSize(t, e.out); res.ArchiveBytes != written || res.ImageBytes <= 0 || res.Files <= 0 || res.DurationNS <= 0 {
			t.Fatalf("export --format %s: %+v, %d bytes written", e.format, res, written)
		}
		t.Logf("export --format %s: image %d bytes in %d files, wrote %d bytes in %v",
			e.format, res.ImageBytes, res.Files, res.ArchiveBytes, time.Duration(res.DurationNS))
	}
	if err := os.RemoveAll(img); err != nil { // the archive is all there is
		t.Fatal(err)
	}
	ackedBefore := len(acked(c.events()))
	n1 := len(c.events())

	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp}
	// As root, an archive another user could have written is refused, as
	// an image is.
	if err := os.Chmod(archive, 0o666); err != nil {
		t.Fatal(err)
	}
	if r := runKCR(t, kcrOpts{env: env}, "restore", "--container", uniqueName("ctr-untrusted"), "--runc-root", c.root, archive); r.code != 5 || !strings.Contains(r.stderr, "--allow-untrusted") {
		t.Errorf("restore from a world-writable archive: exit %d, want 5 naming --allow-untrusted: %s", r.code, r.stderr)
	}
	if err := os.Chmod(archive, 0o600); err != nil {
		t.Fatal(err)
	}
	// The signature travels in the archive: another key is refused before
	// anything is restored.
	if r := runKCR(t, kcrOpts{env: env}, "restore", "--container", uniqueName("ctr-wrongkey"), "--runc-root", c.root, "--verify-key", other+".pub", archive); r.code == 0 || !strings.Contains(r.stderr, "sign") {
		t.Errorf("restore from the archive with another key: exit %d, want a signature error: %s", r.code, r.stderr)
	}
	newID := uniqueName("ctr-new")
	c.removeAtCleanup(newID)
	restoredOut := filepath.Join(t.TempDir(), "restored.log")
	var r kcrResult
	done := make(chan kcrResult, 1)
	go func() {
		done <- runKCR(t, kcrOpts{env: env}, "restore", "--json", "--container", newID, "--runc-root", c.root, "--verify-key", keys+".pub", "--container-output", restoredOut, archive)
	}()
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("kcr restore --container ARCHIVE did not exit within 60 s")
	}
	if r.code != 0 {
		t.Fatalf("kcr restore --container %s %s: exit %d: %s", newID, archive, r.code, r.stderr)
	}
	var out struct {
		Container string `json:"container"`
		Bundle    string `json:"bundle"`
		Restores  []struct {
			PID        int    `json:"pid"`
			Generation uint64 `json:"generation"`
		} `json:"restores"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Restores) != 1 {
		t.Fatalf("restore --json: %v, want one entry in restores\n%s", err, r.stdout)
	}
	if out.Container != newID || out.Restores[0].Generation < 1 || out.Restores[0].PID <= 0 || filepath.Dir(filepath.Dir(out.Bundle)) != tmp {
		t.Errorf("restore --json: %+v, want container %s, a generation, a bundle under %s", out, newID, tmp)
	}
	// Only the built bundle stays: the unpacked image and CRIU's work
	// directory are gone.
	ents, _ := os.ReadDir(tmp)
	if len(ents) != 1 {
		t.Errorf("%s holds %v after the restore, want only the bundle's directory", tmp, ents)
	} else if sub, _ := os.ReadDir(filepath.Join(tmp, ents[0].Name())); len(sub) != 1 || sub[0].Name() != "bundle" {
		t.Errorf("%s holds %v, want only bundle", ents[0].Name(), sub)
	}
	if fi, err := os.Stat(filepath.Dir(out.Bundle)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the bundle's directory is not private: %v %v", fi.Mode(), err)
	}

	c.restoredTo(restoredOut, n1, before)
	if st := runcState(t, c.root, newID); st.Status != "running" || st.Bundle != out.Bundle {
		t.Errorf("runc state %s: %+v, want running in %s", newID, st, out.Bundle)
	}
	c.pid = runcState(t, c.root, newID).Pid
	c.waitAcked(ackedBefore+100, 30*time.Second)

	// The OCI image of "kcr export --format oci" restores too, as a third
	// container (the second copy is stopped first: one producer at a time).
	c.stop(c.pid)
	n2, ackedMid := len(c.events()), len(acked(c.events()))
	ociID := uniqueName("ctr-oci")
	c.removeAtCleanup(ociID)
	ociOut := filepath.Join(t.TempDir(), "oci.log")
	r = runKCR(t, kcrOpts{env: env}, "restore", "--json", "--container", ociID, "--runc-root", c.root, "--container-output", ociOut, oci)
	if r.code != 0 {
		t.Fatalf("kcr restore --container %s %s (OCI layout): exit %d: %s", ociID, oci, r.code, r.stderr)
	}
	c.restoredTo(ociOut, n2, before)
	if st := runcState(t, c.root, ociID); st.Status != "running" {
		t.Errorf("runc state %s: %+v, want running", ociID, st)
	}
	c.pid = runcState(t, c.root, ociID).Pid
	// A second restore as the running container's id: runc refuses,
	// and kcr keeps CRIU's work directory for it, naming it.
	tmp2 := t.TempDir()
	r = runKCR(t, kcrOpts{env: []string{"TMPDIR=" + tmp2}}, "restore", "--container", newID, "--runc-root", c.root, archive)
	if r.code != 4 || !strings.Contains(r.stderr, "CRIU's log, kept: ") {
		t.Fatalf("restore onto a running container's id: exit %d, want 4 naming the kept log: %s", r.code, r.stderr)
	}
	kept := strings.Fields(strings.SplitN(r.stderr, "CRIU's log, kept: ", 2)[1])[0]
	kept = filepath.Dir(strings.TrimRight(kept, ")"))
	if fi, err := os.Stat(kept); err != nil || !fi.IsDir() || !strings.HasPrefix(filepath.Base(kept), "kcr-restore-") {
		t.Errorf("the failed restore's work directory %s is not kept: %v", kept, err)
	}
	if leftovers(t, tmp2, "image") != 0 {
		t.Errorf("the failed restore left its unpacked image in %s", tmp2)
	}

	c.finish(topic, c.pid, ackedMid)
}

// leftovers counts the entries named name anywhere under dir.
func leftovers(t *testing.T, dir, name string) int {
	t.Helper()
	n := 0
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Name() == name {
			n++
		}
		return nil
	})
	return n
}

type runcStatus struct {
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

func runcState(t *testing.T, root, id string) runcStatus {
	t.Helper()
	b, err := exec.Command("runc", "--root", root, "state", id).Output()
	if err != nil {
		t.Fatalf("runc state %s: %v", id, err)
	}
	var st runcStatus
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}
