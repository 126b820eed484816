package container

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// fakePodman writes a podman that logs its arguments to dir/args, answers
// inspect for the test's own process, and copies dir/archive.tar where
// checkpoint --export asks; FAKE_PODMAN_FAIL makes checkpoint fail the
// way a refusing hook does (=reports: with the action script's reports
// beside CRIU's log).
func fakePodman(t *testing.T) (bin, dir string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "podman")
	inspect := `[{"Id":"0123abcd","Name":"svc","State":{"Status":"running","Pid":` + strconv.Itoa(os.Getpid()) + `},"OCIRuntime":"runc","Config":{"Annotations":{}}}]`
	script := `#!/bin/sh
echo "$@" >> ` + dir + `/args
case "$2" in
inspect) [ "$3" = missing ] && { echo "Error: no such container $3" >&2; exit 125; }; echo '` + inspect + `' ;;
checkpoint)
	if [ -n "$FAKE_PODMAN_FAIL" ]; then
		echo "(00.01) kcr-criu-hook: level=WARN msg=\"pre-dump: before-checkpoint hooks failed\" pid=7 err=\"hook x failed\"" > ` + dir + `/dump.log
		[ "$FAKE_PODMAN_FAIL" = reports ] && echo '{"targets":[{"pid":7,"error":"hook y failed","reports":[{"name":"y","error":"hook y failed"}]}]}' > ` + dir + `/kcr-hooks.json
		echo "Error: criu failed: type NOTIFY errno 0 log file: ` + dir + `/dump.log" >&2; exit 125
	fi
	cp ` + dir + `/archive.tar "$4" ;;
restore) echo 4567ef ;;
esac
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "archive.tar"))
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for name, data := range map[string]string{
		"config.dump":                          "{}",
		"checkpoint/inventory.img":             "inv",
		"checkpoint/" + criuaction.ReportsFile: `{"targets":[{"socket":"/run/kcr/kcr-1.sock","reports":[{"name":"kafka-writer/t","duration_ns":2000000}]}]}`,
		"rootfs-diff.tar":                      "",
	} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data))})
		tw.Write([]byte(data))
	}
	tw.Close()
	f.Close()
	return bin, dir
}

func args(t *testing.T, dir string) []string {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, "args"))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestPodmanCheckpointRestore: --runtime podman drives podman container
// checkpoint --export and restore --import with the argument shapes of
// Podman's manual, and the kcr image holds Podman's archive, verified, with
// the hooks' reports that kcr's action script left in it.
func TestPodmanCheckpointRestore(t *testing.T) {
	bin, dir := fakePodman(t)
	img := filepath.Join(t.TempDir(), "img")
	ctx := context.Background()
	res, err := CheckpointContainer(ctx, CheckpointOptions{Target: Target{ID: "svc", Runtime: bin}, Output: img, LeaveRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	a := args(t, dir)
	want := "container checkpoint --export " + filepath.Join(filepath.Dir(img), "") // the builder's hidden directory
	if len(a) != 2 || a[0] != "container inspect svc" || !strings.HasPrefix(a[1], want) ||
		!strings.HasSuffix(a[1], "/"+PodmanArchive+" --compress none --leave-running svc") {
		t.Errorf("podman calls %q", a)
	}
	if res.Timings.Get(PhasePodmanCheckpoint) == 0 || res.Timings.Get(engine.PhaseHooks) == 0 {
		t.Errorf("phases %v: want podman checkpoint and the hooks", res.Timings)
	}
	if len(res.Manifest.Resources) != 1 || res.Manifest.Resources[0].Name != "kafka-writer/t" || res.Manifest.Process.PID != os.Getpid() {
		t.Errorf("manifest resources %v, process %+v", res.Manifest.Resources, res.Manifest.Process)
	}
	opened, err := images.Open(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(opened.Manifest.Files, func(f images.FileEntry) bool { return f.Path == PodmanArchive }) {
		t.Errorf("the manifest does not list %s: %v", PodmanArchive, opened.Manifest.Files)
	}

	os.Remove(filepath.Join(dir, "args"))
	r, err := RestoreContainer(ctx, RestoreOptions{Target: Target{ID: "svc-2", Runtime: bin}, Image: img})
	if err != nil {
		t.Fatal(err)
	}
	a = args(t, dir)
	if len(a) != 2 || a[0] != "container restore --import "+filepath.Join(img, PodmanArchive)+" --name svc-2" || a[1] != "container inspect 4567ef" {
		t.Errorf("podman calls %q", a)
	}
	if r.Generation != 1 || r.PID != os.Getpid() || r.Timings.Get(PhasePodmanRestore) == 0 {
		t.Errorf("restore result %+v", r)
	}
}

// TestPodmanCheckpointRefused: a missing container is ErrContainerState,
// and a hook that refuses (named in the CRIU log Podman points to) is a
// HookError, with no image left.
func TestPodmanCheckpointRefused(t *testing.T) {
	bin, _ := fakePodman(t)
	parent := t.TempDir()
	ctx := context.Background()
	_, err := CheckpointContainer(ctx, CheckpointOptions{Target: Target{ID: "missing", Runtime: bin}, Output: filepath.Join(parent, "a")})
	if !errors.Is(err, ErrContainerState) {
		t.Errorf("missing container: %v", err)
	}
	t.Setenv("FAKE_PODMAN_FAIL", "1")
	_, err = CheckpointContainer(ctx, CheckpointOptions{Target: Target{ID: "svc", Runtime: bin}, Output: filepath.Join(parent, "b")})
	var he *proto.HookFailure
	if !errors.As(err, &he) || !strings.Contains(err.Error(), "hook x failed") {
		t.Errorf("refusing hook: %v", err)
	}
	t.Setenv("FAKE_PODMAN_FAIL", "reports")
	_, err = CheckpointContainer(ctx, CheckpointOptions{Target: Target{ID: "svc", Runtime: bin}, Output: filepath.Join(parent, "c")})
	if !errors.As(err, &he) || len(he.Reports) != 1 || !strings.Contains(err.Error(), "hook y failed") {
		t.Errorf("refusing hook, with reports: %v", err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Errorf("left %v", ents)
	}
}
