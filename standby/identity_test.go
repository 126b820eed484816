package standby

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIdentityEnvIgnored(t *testing.T) {
	for _, c := range []struct {
		name  string
		extra []string
		want  bool
	}{
		{"HOSTNAME", nil, true},
		{"INVOCATION_ID", nil, true},
		{markerEnv, nil, true},
		{"KAFKA_BROKERS", nil, false},
		{"POD_NAME", []string{"POD_NAME"}, true},
		{"POD_IP", []string{"POD_*"}, true},
		{"APOD_IP", []string{"POD_*"}, false},
		{"ANYTHING", []string{"*"}, true},
	} {
		if got := identityEnvIgnored(c.name, c.extra); got != c.want {
			t.Errorf("identityEnvIgnored(%q, %q) = %v, want %v", c.name, c.extra, got, c.want)
		}
	}
}

func TestIdentityChanges(t *testing.T) {
	o := &Options{Args: []string{"svc", "-a"}, Env: []string{"E=1"}, Group: "g", Topics: []string{"b", "a"}}
	base := func(salt string) identity {
		env := map[string]string{"A": "1", "E": "1"}
		return identity{Exe: "/bin/svc", ExeSize: 10, ExeSHA256: "x", Args: o.Args, EnvNames: []string{"A", "E"}, EnvSalt: salt,
			EnvDigest: envDigest(salt, env), EnvFlagsDigest: envDigest(salt, countedEnv(o.Env, nil)), Group: "g", Topics: []string{"a", "b"}}
	}
	rec := base("s1")
	for _, c := range []struct {
		name   string
		change func(*identity)
		want   string
	}{
		{"same", func(*identity) {}, ""},
		{"binary", func(w *identity) { w.ExeSHA256 = "y" }, "the binary changed"},
		{"size", func(w *identity) { w.ExeSize = 11 }, "the binary changed"},
		{"path", func(w *identity) { w.Exe = "/opt/svc" }, "the binary changed"},
		{"args", func(w *identity) { w.Args = []string{"svc", "-b"} }, "the arguments changed"},
		{"-e", func(w *identity) { w.EnvFlagsDigest = envDigest(w.EnvSalt, map[string]string{"E": "2"}) }, "-e changed"},
		{"value", func(w *identity) { w.EnvDigest = envDigest(w.EnvSalt, map[string]string{"A": "2", "E": "1"}) }, "the environment changed: a value"},
		{"names", func(w *identity) { w.EnvNames = []string{"B", "E"} }, "the environment changed: added B; removed A"},
		{"group", func(w *identity) { w.Group = "h" }, "--group changed"},
		{"topics", func(w *identity) { w.Topics = []string{"a"} }, "--topics changed"},
		{"listen", func(w *identity) { w.Listen = ":80" }, "--listen changed"},
		{"two", func(w *identity) { w.ExeSHA256, w.Group = "y", "h" }, "the binary changed, --group changed"},
	} {
		w := base("s1")
		c.change(&w)
		if got := rec.changes(w); got != c.want {
			t.Errorf("%s: changes = %q, want %q", c.name, got, c.want)
		}
	}
	// Another salt, the same values: a digest of the record's salt
	// compares; one of another salt does not tell the values.
	if base("s2").EnvDigest == rec.EnvDigest {
		t.Error("the environment digest does not depend on the salt")
	}
}

func TestMissingCPUFlags(t *testing.T) {
	here := parseCPUFlags(strings.NewReader("processor\t: 0\nflags\t\t: sse2 avx2 fpu avx\nprocessor\t: 1\nflags\t\t: sse2\n"))
	if !slices.Equal(here, []string{"avx", "avx2", "fpu", "sse2"}) {
		t.Fatalf("parseCPUFlags = %v", here)
	}
	arm := parseCPUFlags(strings.NewReader("processor\t: 0\nFeatures\t: fp asimd\n"))
	if !slices.Equal(arm, []string{"asimd", "fp"}) {
		t.Fatalf("parseCPUFlags (arm64) = %v", arm)
	}
	if m := missingCPUFlags([]string{"avx2", "avx512f", "sse2"}, here); !slices.Equal(m, []string{"avx512f"}) {
		t.Errorf("missing %v, want [avx512f]", m)
	}
	if m := missingCPUFlags([]string{"avx2"}, here); m != nil {
		t.Errorf("missing %v, want none", m)
	}
	if m := missingCPUFlags(nil, here); m != nil {
		t.Errorf("an image without a record misses %v", m)
	}
	if m := missingCPUFlags([]string{"avx2"}, nil); m != nil {
		t.Errorf("unknown flags here refuse %v", m)
	}
	if len(cpuFlags()) == 0 || kernelRelease() == "" {
		t.Errorf("this machine: flags %v, kernel %q", cpuFlags(), kernelRelease())
	}
}

func TestIdentityRecord(t *testing.T) {
	dir := t.TempDir()
	d := &imageDir{path: dir}
	os.Mkdir(filepath.Join(dir, "img-000002"), 0o700)
	id := identity{Exe: "/bin/x", Args: []string{"x"}, CPUFlags: []string{"fpu"}}
	for _, n := range []string{"img-000001", "img-000002"} {
		if err := writeIdentity(dir, n, id); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, ".identity-123"), nil, 0o600) // a killed write's
	d.pruneIdentities()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"identity-img-000002.json", "img-000002"}; !slices.Equal(names, want) {
		t.Errorf("after prune: %v, want %v", names, want)
	}
	got, ok, err := readIdentity(dir, "img-000002")
	if err != nil || !ok || got.Exe != id.Exe || !slices.Equal(got.CPUFlags, id.CPUFlags) {
		t.Errorf("readIdentity = %+v, %v, %v", got, ok, err)
	}
	if fi, _ := os.Stat(identityFile(dir, "img-000002")); fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode %v, want 0600", fi.Mode().Perm())
	}
	if _, ok, err := readIdentity(dir, "img-000009"); ok || err != nil {
		t.Errorf("a missing record: ok %v, err %v", ok, err)
	}
	// Not an image, nor a number above the images.
	if n, _ := d.nextImage(); n != "img-000003" {
		t.Errorf("nextImage = %s", n)
	}
	if imgs, _ := d.imagesNewestFirst(); len(imgs) != 0 {
		t.Errorf("images %v: none is complete", imgs)
	}
}

// copyFile copies the executable src to dst through a temporary renamed
// over it, as a package manager does.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	out.Close()
	if err := os.Rename(dst+".tmp", dst); err != nil {
		t.Fatal(err)
	}
}

// procExe reads the executable a process runs, and sees it replaced
// (renamed over, as a package manager does); an image's record of it
// tells when the file a restore would map changed.
func TestProcExe(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "svc")
	copyFile(t, sleep, bin)
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var path, sum string
	var size int64
	var replaced bool
	deadline := time.Now().Add(10 * time.Second)
	for { // until the child exec'd
		path, size, sum, replaced, err = procExe(cmd.Process.Pid)
		if err == nil && path == bin || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	wsize, wsum, werr := exeDigest(bin)
	if err != nil || replaced || path != bin || werr != nil || size != wsize || sum != wsum {
		t.Fatalf("procExe = %q %d %q replaced %v, %v; the file: %d %q %v", path, size, sum, replaced, err, wsize, wsum, werr)
	}
	rec := identity{ProcExe: path, ProcExeSize: size, ProcExeSHA256: sum}
	if why := rec.exeChanged(); why != "" {
		t.Errorf("the same file: %q", why)
	}
	copyFile(t, "/bin/sh", bin)
	if _, _, _, replaced, err := procExe(cmd.Process.Pid); err != nil || !replaced {
		t.Errorf("binary renamed over: replaced %v, err %v", replaced, err)
	}
	if why := rec.exeChanged(); why != "the binary changed" {
		t.Errorf("another file: %q", why)
	}
	os.Remove(bin)
	if why := rec.exeChanged(); why != "the binary changed" {
		t.Errorf("no file: %q", why)
	}
}

// What a cold start would run is computed from the options alone, the
// same way each time: a digest compares under the same salt, and -e, the
// environment kcr inherits and the arguments each tell their change.
func TestWantedIdentity(t *testing.T) {
	o := &Options{Args: []string{"sleep", "60"}, Env: []string{"KCR_TEST_E=1"}, Group: "g"}
	t.Setenv("KCR_TEST_INHERITED", "1")
	a, err := wantedIdentity(o, "salt")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := wantedIdentity(o, "salt"); a.changes(b) != "" {
		t.Errorf("the same options: %q", a.changes(b))
	}
	t.Setenv("HOSTNAME", "another-pod")
	if b, _ := wantedIdentity(o, "salt"); a.changes(b) != "" {
		t.Errorf("HOSTNAME counted: %q", a.changes(b))
	}
	t.Setenv("KCR_TEST_INHERITED", "2")
	if b, _ := wantedIdentity(o, "salt"); a.changes(b) != "the environment changed: a value" {
		t.Errorf("inherited variable: %q", a.changes(b))
	}
	o2 := *o
	o2.Env, o2.Args = []string{"KCR_TEST_E=2"}, []string{"sleep", "61"}
	if b, _ := wantedIdentity(&o2, "salt"); a.changes(b) != "the arguments changed, -e changed" {
		t.Errorf("arguments and -e: %q", a.changes(b))
	}
	if !strings.HasPrefix(a.Exe, "/") || a.ExeSHA256 == "" || slices.Contains(a.EnvNames, markerEnv) {
		t.Errorf("identity %+v", a)
	}
}

// An image whose identity differs from what a start would run is removed,
// at start or at wake, with one INFO line; the service starts cold, with
// no error and no image set aside. An image from a CPU with a feature this
// one lacks goes the same way, with a WARN line.
func TestOutdatedImageNotRestored(t *testing.T) {
	trueBin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "svc")
	copyFile(t, trueBin, bin)
	// TermLeave: each phase ends its rig with the service as it is, not
	// checkpointed by the shutdown policy, so the next phase starts cold.
	mod := func(o *Options) { o.Args = []string{bin, "-x"}; o.OnTerm = TermLeave }
	dir := filepath.Join(t.TempDir(), "img")
	record := func(change func(*identity)) {
		t.Helper()
		o := testOptions(dir)
		mod(&o)
		w, err := wantedIdentity(&o, newSalt())
		if err != nil {
			t.Fatal(err)
		}
		w.CPUFlags = hereCPUFlags()
		change(&w)
		if err := writeIdentity(dir, imageName(1), w); err != nil {
			t.Fatal(err)
		}
	}
	check := func(r *rig, f *fake, msg, level string) {
		t.Helper()
		r.waitState(StateRunning)
		if starts, restores, _ := f.snapshot(); starts != 1 || len(restores) != 0 {
			t.Errorf("starts %d, restores %v; want one cold start, no restore", starts, restores)
		}
		logs := r.log.String()
		if n := strings.Count(logs, `"msg":"standby: not restoring the image, `+msg); n != 1 || !strings.Contains(logs, `"level":"`+level+`","msg":"standby: not restoring`) {
			t.Errorf("%d lines %q at %s, want 1:\n%s", n, msg, level, logs)
		}
		if strings.Contains(logs, `"level":"ERROR"`) {
			t.Errorf("an ERROR logged:\n%s", logs)
		}
		if ents := imagesIn(t, dir); len(ents) != 0 {
			t.Errorf("images left: %v", ents)
		}
		r.end()
	}

	// At start: the arguments changed.
	r := startRig(t, newFake(), dir, mod)
	r.waitState(StateStandby)
	r.end()
	record(func(w *identity) { w.Args = []string{bin, "-y"} })
	f := newFake()
	check(startRig(t, f, dir, mod), f, "the arguments changed; starting the service cold", "INFO")

	// At wake: the binary replaced while the service slept.
	f = newFake()
	r = startRig(t, f, dir, func(o *Options) { mod(o); o.Idle = time.Hour })
	r.waitState(StateRunning)
	r.s.Sleep()
	r.waitState(StateStandby)
	record(func(*identity) {})
	copyFile(t, "/bin/sh", bin)
	f.mu.Lock()
	f.starts = 0
	f.mu.Unlock()
	r.s.Wake("manual")
	check(r, f, "the binary changed; starting the service cold", "INFO")

	// At start: a CPU feature missing here.
	r = startRig(t, newFake(), dir, mod)
	r.waitState(StateStandby)
	r.end()
	record(func(w *identity) { w.CPUFlags = append(w.CPUFlags, "kcr_test_feature") })
	f = newFake()
	check(startRig(t, f, dir, mod), f, "this CPU lacks features of the CPU the image was dumped on (kcr_test_feature)", "WARN")
}
