package e2e

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/kcr-dev/kcr/criuaction"
)

// The hooked service of the runtime tests (Podman, CRI): kafkaapp producing
// 200 records a second to a topic and consuming it as the only member of a
// group, with client id base. Its before-checkpoint hooks must flush the
// Writer, leave the group and close every broker connection; a restored copy
// must come back as a new instance with new client ids.

// serviceArgs are kafkaapp's arguments (after the program).
func serviceArgs(k *kafkaEnv, topic, group, base string) []string {
	return []string{"-brokers", k.brokers, "-topic", topic, "-produce-rate", "200",
		"-consume", "-group", group, "-client-id", base}
}

// waitServing waits until a, started with serviceArgs, is the one member of
// its group and owns partitions, has 100 records acknowledged and 50
// processed, and returns its state then.
func (k *kafkaEnv) waitServing(a *kapp, topic, group, base string) appState {
	k.t.Helper()
	k.waitGroup(group, topic, 60*time.Second, "the service in its group", func(v groupView) bool {
		return len(v.clients) == 1 && v.clients[0] == base && len(v.assigned[base]) > 0
	})
	a.waitAcked(100, 30*time.Second)
	a.waitProcessed(0, 50, 30*time.Second)
	return a.state()
}

// imageTar writes a one-layer root filesystem holding kafkaapp (static) and
// pause, for runtimes that start containers from images, once per run (in
// binDir; the tests only read it).
func imageTar(t *testing.T) string {
	t.Helper()
	if rootfsTar != "" {
		return rootfsTar
	}
	p := filepath.Join(binDir, "rootfs.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for name, src := range map[string]string{"kafkaapp": staticKafkaapp(t), "kgoapp": staticKgoapp(t), "pause": staticPause(t)} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"tmp/", "run/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o1777, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	rootfsTar = p
	return p
}

var rootfsTar, rootfsLayer string

// imageLayer is imageTar's file as an image layer, compressed once per run:
// go-containerregistry would gzip the tar at each use otherwise, ~30 s
// under -race.
func imageLayer(t *testing.T) v1.Layer {
	t.Helper()
	if rootfsLayer == "" {
		p := filepath.Join(binDir, "rootfs.tar.gz")
		in, err := os.Open(imageTar(t))
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		out, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
		if _, err := io.Copy(zw, in); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
		rootfsLayer = p
	}
	// A gzip file is taken as the compressed layer as it is.
	l, err := tarball.LayerFromFile(rootfsLayer)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var pauseBin string

// staticPause builds test/apps/pause without cgo.
// staticKgoapp builds kgoapp without cgo, for the images of the CRI and
// kubelet tests.
func staticKgoapp(t *testing.T) string {
	t.Helper()
	if kgoStaticBin == "" {
		p := filepath.Join(binDir, "kgoapp-static")
		cmd := exec.Command("go", "build", "-o", p, "../apps/kgoapp")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build kgoapp: %v\n%s", err, out)
		}
		kgoStaticBin = p
	}
	return kgoStaticBin
}

// kgoStaticBin is staticKgoapp's binary once built.
var kgoStaticBin string

func staticPause(t *testing.T) string {
	t.Helper()
	if pauseBin == "" {
		p := filepath.Join(binDir, "pause-static")
		cmd := exec.Command("go", "build", "-o", p, "../apps/pause")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build pause: %v\n%s", err, out)
		}
		pauseBin = p
	}
	return pauseBin
}

// checkHookReports asserts, from the hooks' reports that the action script
// left beside CRIU's images (criuaction.ReportsFile, found in the runtime's
// checkpoint archive), that the before-checkpoint hooks ran: the Writer
// flushed every record and closed its connections, the Reader left the group
// and closed (kafka-go's Close ends its connections itself). That no socket
// stayed open CRIU shows by dumping at all: kcr's configuration has neither
// tcp-established nor tcp-close, and CRIU refuses a connected TCP socket.
func checkHookReports(t *testing.T, b []byte, topic, group string) {
	t.Helper()
	if len(b) == 0 {
		t.Fatalf("the checkpoint archive has no %s: kcr's action script did not run at the dump", criuaction.ReportsFile)
	}
	var res criuaction.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("%s: %v", criuaction.ReportsFile, err)
	}
	if res.Action != criuaction.ActionPreDump || len(res.Targets) != 1 {
		t.Fatalf("%s: action %q, %d targets; want pre-dump with the one app: %s", criuaction.ReportsFile, res.Action, len(res.Targets), b)
	}
	details := map[string]map[string]any{}
	for _, r := range res.Targets[0].Reports {
		if r.Error != "" {
			t.Errorf("hook %s failed: %s", r.Name, r.Error)
		}
		details[r.Name] = r.Details
	}
	w, r := details["kafka-writer/"+topic], details["kafka-reader/"+group]
	t.Logf("before-checkpoint reports: writer %v; reader %v", w, r)
	if w == nil || r == nil {
		t.Fatalf("no writer or reader report among %v", slices.Collect(mapKeys(details)))
	}
	if w["drained"] != true || w["records_carried"] != 0.0 || num(w["connections_closed"]) < 1 {
		t.Errorf("writer report %v: want drained, nothing carried, its connections closed", w)
	}
	if r["left_group"] != true || r["closed_cleanly"] != true {
		t.Errorf("reader report %v: want the group left and the reader closed cleanly", r)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// waitLeft waits until the broker shows the group without members: the
// checkpointed member left it rather than timing out.
func (k *kafkaEnv) waitLeft(group, topic string, took time.Duration) {
	k.t.Helper()
	t0 := time.Now()
	k.waitGroup(group, topic, 5*time.Second, "the group empty after the checkpoint (its member left)", func(v groupView) bool {
		return len(v.clients) == 0
	})
	k.t.Logf("the broker showed the group empty %v after the call returned (which took %v)", time.Since(t0).Round(time.Millisecond), took.Round(time.Millisecond))
}

// checkNewInstance waits for the after-restore event of a new instance
// after the first n events (a restored copy's log may repeat the
// original's, resumes included), and asserts it is a restore whose client
// ids are base-<instance prefix>, and that the broker has that client in
// the group. It returns the new client id.
func checkNewInstance(t *testing.T, a *kapp, n int, before appState, base, group, topic string) string {
	t.Helper()
	var after event
	eventually(t, 30*time.Second, "the after-restore hooks of a new instance", func() (bool, string) {
		for _, e := range a.since(n) {
			if e["ev"] == "after" && e.str("instance") != before.Instance {
				after = e
				return true, ""
			}
		}
		return false, fmt.Sprintf("last events %v", tail(a.events(), 5))
	})
	t.Logf("after-restore event of the copy: %v", after)
	inst := after.str("instance")
	if after.str("kind") != "restore" || inst == "" {
		t.Fatalf("after-restore event %v: want kind restore and a new instance id (was %q)", after, before.Instance)
	}
	// "restored": kcr's action script told it, at CRIU's post-resume (the
	// app would also find out by itself, and say so).
	if r := after.str("reason"); r != "restored" {
		t.Errorf("after-restore reason %q, want restored (kcr's message at post-resume)", r)
	}
	want := base + "-" + prefix8(inst)
	if after.str("writer_client") != want || after.str("reader_client") != want {
		t.Errorf("after-restore client ids: writer %q, reader %q; want %q", after.str("writer_client"), after.str("reader_client"), want)
	}
	a.k.waitGroup(group, topic, 60*time.Second, "the restored copy in the group as "+want, func(v groupView) bool {
		return slices.Contains(v.clients, want)
	})
	return want
}

// followInto points the app's log at a new file (a restored copy logs from
// its start again); the events read so far are kept.
func (a *kapp) followInto(p string) {
	a.logMu.Lock()
	a.out, a.logOff = p, 0
	a.logMu.Unlock()
}

// waitExit waits for kafkaapp's exit event after the first n events (the
// runtime stopped it with SIGTERM: it flushed and closed its clients).
func (a *kapp) waitExit(n int) {
	a.t.Helper()
	eventually(a.t, 60*time.Second, "kafkaapp to exit after SIGTERM", func() (bool, string) {
		return count(a.since(n), "exit") > 0, fmt.Sprintf("last events %v", tail(a.events(), 3))
	})
}

func oneLine(b []byte) string { return strings.Join(strings.Fields(string(b)), " ") }

// tarMember returns the content of a regular file in an uncompressed tar,
// nil if it has none.
func tarMember(t *testing.T, file, name string) []byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil
		}
		if filepath.Clean(h.Name) == name && h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
