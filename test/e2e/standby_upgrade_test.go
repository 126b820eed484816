package e2e

// kcr standby through a service's deploys: a new binary while the service
// sleeps or runs, changed arguments and environment, an image from a CPU
// with other features, and a wake that brings no work. kcr standby runs as
// init of its own PID namespace, as a container's entrypoint, unless a
// test says otherwise.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// upgradeRig is one service under kcr standby, run from a copy of its
// binary that the test replaces the way a package manager does.
type upgradeRig struct {
	t     *testing.T
	k     *kafkaEnv
	bin   string // the service's binary (the copy)
	dir   string // --image-dir
	topic string
	group string
	flags []string
	svc   []string
	s     *sbRun
	// host runs kcr standby in the host's PID namespace rather than as
	// init of its own (a container's entrypoint, the default).
	host bool
}

func newUpgradeRig(t *testing.T, k *kafkaEnv, app string, flags ...string) *upgradeRig {
	r := &upgradeRig{t: t, k: k, dir: filepath.Join(t.TempDir(), "img"),
		topic: k.newTopic("standby-upgrade", 2), group: uniqueName("standby-upgrade")}
	r.bin = filepath.Join(t.TempDir(), "svc-"+filepath.Base(app))
	copyExe(t, app, r.bin, "")
	r.flags = append([]string{"--idle", "1s", "--group", r.group, "--topics", r.topic, "--poll", "100ms", "--max-backoff", "2s"}, flags...)
	r.svc = consumerArgs(r.bin, k.brokers, r.topic, r.group)
	return r
}

func (r *upgradeRig) start() {
	if r.host {
		r.s = r.k.startStandby(r.dir, r.flags, r.svc...)
		return
	}
	r.s = r.k.startStandbyInit(r.dir, r.flags, r.svc...)
}

// copyExe writes src to dst the way dpkg, rpm and go build -o do: a new
// file renamed over the old one (a running process keeps the old one,
// deleted). extra is appended: another version of the binary.
func copyExe(t *testing.T, src, dst, extra string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	tmp := dst + ".new"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(out, in)
	if err == nil {
		_, err = out.WriteString(extra)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// work produces n records and waits until the service processed each
// once and the group committed them all (the broker's view).
func (r *upgradeRig) work(n int) {
	r.t.Helper()
	r.k.produceN(r.topic, n)
	r.s.waitAllProcessed(r.topic, 90*time.Second)
	r.k.waitCommitted(r.group, r.topic, r.k.endOffsets(r.topic), 60*time.Second)
}

// checkClean fails on any ERROR kcr standby logged, any failed checkpoint
// or restore, and any image set aside.
func (r *upgradeRig) checkClean() {
	r.t.Helper()
	for _, m := range r.s.logs() {
		if m["level"] == "ERROR" {
			r.t.Errorf("kcr standby logged an ERROR: %v", m)
		}
	}
	if n := r.s.countLogs("standby: checkpoint refused or failed; the service resumed and runs on"); n > 0 {
		r.t.Errorf("%d failed checkpoints", n)
	}
	if bad, _ := filepath.Glob(filepath.Join(r.dir, "bad-*")); len(bad) > 0 {
		r.t.Errorf("images set aside: %v", bad)
	}
}

// A new binary while the service sleeps: the image is not restored (CRIU
// would refuse it), one INFO line says why, the new binary starts cold and
// takes the records; nothing is set aside, nothing counted as a failure.
// Its own image is then restored warm.
func TestStandbyNewBinaryAsleep(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) {
			r := newUpgradeRig(t, needKafka(t), c.bin)
			r.start()
			r.s.waitState("standby", 90*time.Second)
			copyExe(t, c.bin, r.bin, "kcr-e2e v2")
			r.work(6)
			if n := r.s.countLogs("standby: not restoring the image, the binary changed; starting the service cold", "at", "wake"); n != 1 {
				t.Errorf("%d lines saying the binary changed, want 1", n)
			}
			r.s.waitState("standby", 90*time.Second)
			r.work(4)
			r.s.waitState("standby", 90*time.Second)
			if n := r.s.countLogs("standby: starting"); n != 2 {
				t.Errorf("%d cold starts, want 2 (first start, new binary)", n)
			}
			if n := r.s.countLogs("standby: running", "source", "kafka"); n != 1 {
				t.Errorf("%d restores, want 1 (the new binary's image)", n)
			}
			r.checkClean()
		})
	}
}

// A binary replaced under the running service (renamed over): before its
// checkpoint (before its hooks), kcr standby stops it gracefully and
// starts the new binary cold, with one INFO line, instead of failing the
// checkpoint at every idle. The new one then sleeps and wakes as usual.
func TestStandbyNewBinaryRunning(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) {
			r := newUpgradeRig(t, needKafka(t), c.bin)
			r.flags[1] = "1h" // --idle: the test asks for each sleep
			r.start()
			r.s.waitState("running", 90*time.Second)
			r.work(5)
			copyExe(t, c.bin, r.bin, "kcr-e2e v2")
			sleepNow(t, r.dir)
			eventually(t, 90*time.Second, "the new binary started", func() (bool, string) {
				n := r.s.countLogs("standby: starting")
				return n == 2, fmt.Sprintf("%d cold starts", n)
			})
			r.s.waitState("running", 90*time.Second)
			if n := r.s.countLogs("standby: the binary was replaced under the running service; stopping the service and starting it cold, in place of its checkpoint"); n != 1 {
				t.Errorf("%d lines saying the binary was replaced, want 1", n)
			}
			exits := 0
			for _, e := range r.s.svcEvents() {
				if e["ev"] == "exit" {
					exits++
				}
			}
			if exits != 1 {
				t.Errorf("%d graceful exits of the service, want 1 (the old binary's)", exits)
			}
			r.work(3)
			sleepNow(t, r.dir)
			r.s.waitState("standby", 90*time.Second)
			r.work(4)
			r.checkClean()
		})
	}
}

// sleepNow asks kcr standby of dir to checkpoint its service now.
func sleepNow(t *testing.T, dir string) {
	t.Helper()
	eventually(t, 30*time.Second, "kcr standby takes the sleep", func() (bool, string) {
		ok, err := rawControl(dir, "sleep")
		return ok && err == nil, fmt.Sprint(ok, err)
	})
}

// Changed arguments, -e and inherited environment while the service
// sleeps: each time, kcr standby started again does not restore the image
// and names what changed in one INFO line; a changed HOSTNAME (another
// pod) does not count, and the image is restored warm.
func TestStandbyChangedConfig(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) { testChangedConfig(t, c.bin) })
	}
}

func testChangedConfig(t *testing.T, bin string) {
	r := newUpgradeRig(t, needKafka(t), bin)
	t.Setenv("KCR_E2E_CONF", "1")
	t.Setenv("HOSTNAME", "pod-a")
	base := append([]string{}, r.flags...)
	steps := []struct {
		what   string
		change func()
		why    string // "": restored warm
	}{
		{"first start", func() {}, ""},
		{"arguments", func() { r.svc = append(r.svc, "-log-level", "debug") }, "the arguments changed"},
		{"-e", func() { r.flags = append(append([]string{}, base...), "-e", "KCR_E2E_FLAG=2") }, "-e changed"},
		{"environment", func() { t.Setenv("KCR_E2E_CONF", "2") }, "the environment changed: a value"},
		{"new variable", func() { t.Setenv("KCR_E2E_NEW", "x") }, "the environment changed: added KCR_E2E_NEW"},
		{"HOSTNAME", func() { t.Setenv("HOSTNAME", "pod-b") }, ""},
	}
	for i, st := range steps {
		st.change()
		r.start()
		r.work(3)
		r.s.waitState("standby", 90*time.Second)
		if st.why != "" {
			if n := r.s.countLogs("standby: not restoring the image, "+st.why+"; starting the service cold", "at", "start"); n != 1 {
				t.Errorf("%s: %d lines %q, want 1", st.what, n, st.why)
			}
		}
		want := 0
		if st.why != "" || i == 0 {
			want = 1
		}
		if n := r.s.countLogs("standby: starting"); n != want {
			t.Errorf("%s: %d cold starts, want %d", st.what, n, want)
		}
		r.checkClean()
		r.s.stop(syscall.SIGKILL)
	}
}

// A changed --group, then a changed --topics, while the service sleeps
// (the service's own flags changed with them, as a user edits both): the
// image is not restored (the restored copy would consume on the old group
// or topic while kcr standby watches the new one), one INFO line names
// --group or --topics, and the service starts cold on the new group or
// topic and takes every record there once, with nothing missing.
func TestStandbyChangedGroup(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) { testChangedGroup(t, c.bin) })
	}
}

func testChangedGroup(t *testing.T, bin string) {
	r := newUpgradeRig(t, needKafka(t), bin)
	steps := []struct {
		what, why string
		change    func()
	}{
		{"first start", "", func() {}},
		{"--group", "--group changed", func() { r.group = uniqueName("standby-upgrade-g2") }},
		{"--topics", "--topics changed", func() { r.topic = r.k.newTopic("standby-upgrade-t2", 2) }},
	}
	for _, st := range steps {
		st.change()
		r.flags[3], r.flags[5] = r.group, r.topic
		r.svc = consumerArgs(r.bin, r.k.brokers, r.topic, r.group)
		// Only this start's events: a new group reads its topic again.
		fi, err := os.Stat(r.dir + ".service.log")
		var off int64
		if err == nil {
			off = fi.Size()
		}
		r.start()
		r.k.produceN(r.topic, 3)
		a := &app{t: t, out: r.dir + ".service.log", logOff: off}
		ends := r.k.endOffsets(r.topic)
		eventually(t, 90*time.Second, st.what+": every record of "+r.topic+" processed on "+r.group, func() (bool, string) {
			got := processed(a.events())
			missing := 0
			for p, end := range ends {
				for o := int64(0); o < end; o++ {
					if got[po{p, o}] == 0 {
						missing++
					}
				}
			}
			return missing == 0, fmt.Sprintf("%d missing", missing)
		})
		for k, n := range processed(a.events()) {
			if n > 1 {
				t.Errorf("%s: partition %d offset %d processed %d times", st.what, k.p, k.o, n)
			}
		}
		r.k.waitCommitted(r.group, r.topic, ends, 60*time.Second)
		r.s.waitState("standby", 90*time.Second)
		want := 1
		if st.why != "" {
			line := "standby: not restoring the image, the arguments changed, " + st.why + "; starting the service cold"
			if n := r.s.countLogs(line, "at", "start"); n != 1 {
				t.Errorf("%s: %d lines %q, want 1", st.what, n, line)
			}
		}
		if n := r.s.countLogs("standby: starting"); n != want {
			t.Errorf("%s: %d cold starts, want %d", st.what, n, want)
		}
		if n := r.s.countLogs("standby: running", "source", "kafka"); n != 0 {
			t.Errorf("%s: %d restores of the old image, want 0", st.what, n)
		}
		r.checkClean()
		r.s.stop(syscall.SIGKILL)
	}
}

// An image dumped on a CPU with a feature this one lacks (its identity
// record says so) is not restored: one line names the feature, the service
// starts cold, and nothing is lost.
func TestStandbyImageFromOtherCPU(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) { testImageFromOtherCPU(t, c.bin) })
	}
}

func testImageFromOtherCPU(t *testing.T, bin string) {
	r := newUpgradeRig(t, needKafka(t), bin)
	r.start()
	st := r.s.waitState("standby", 90*time.Second)
	r.s.stop(syscall.SIGKILL)
	rec := filepath.Join(r.dir, "identity-"+st.Image+".json")
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatalf("the image's identity record: %v", err)
	}
	var id map[string]any
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatal(err)
	}
	flags, _ := id["cpu_flags"].([]any)
	if len(flags) == 0 {
		t.Fatalf("no CPU flags recorded: %s", b)
	}
	id["cpu_flags"] = append(flags, "kcr_e2e_feature")
	if b, err = json.Marshal(id); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rec, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.start()
	r.work(5)
	n := 0
	for _, m := range r.s.logs() {
		if msg, _ := m["msg"].(string); strings.Contains(msg, "this CPU lacks features of the CPU the image was dumped on (kcr_e2e_feature)") && m["level"] == "WARN" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d lines naming the missing CPU feature, want 1", n)
	}
	if _, err := os.Stat(filepath.Join(r.dir, st.Image)); err == nil {
		t.Errorf("the image %s is still there", st.Image)
	}
	r.checkClean()
}

// A wake with no work, then sleep: kcr standby's watch of the restored
// service's first activity must not be connected to its control socket
// when CRIU dumps it, or the checkpoint fails. Several cycles, so that a
// dump that would meet the watch's connection does.
func TestStandbyWakeWithoutWork(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) { testWakeWithoutWork(t, c.bin) })
	}
}

func testWakeWithoutWork(t *testing.T, bin string) {
	r := newUpgradeRig(t, needKafka(t), bin)
	r.start()
	for cycle := 1; cycle <= 4; cycle++ {
		r.s.waitState("standby", 90*time.Second)
		if out, err := (kcrOpts{}).cmd("standby", "wake", "--image-dir", r.dir).CombinedOutput(); err != nil {
			t.Fatalf("cycle %d: kcr standby wake: %v: %s", cycle, err, out)
		}
		eventually(t, 60*time.Second, "the wake's restore", func() (bool, string) {
			n := r.s.countLogs("standby: running", "source", "manual")
			return n >= cycle, fmt.Sprintf("%d restores", n)
		})
	}
	r.s.waitState("standby", 90*time.Second)
	r.work(5)
	r.s.waitState("standby", 90*time.Second)
	r.checkClean()
}

// Arguments changed while the service runs: kcr standby is restarted with
// them (an edited unit), adopts the running copy, and at its next idle
// stops it and starts it cold with the new arguments, with one INFO line,
// instead of checkpointing the old ones. On a host: as a container's init,
// kcr standby takes the running copy with it when it dies.
func TestStandbyChangedConfigRunning(t *testing.T) {
	for _, c := range []struct{ name, bin string }{{"kafka-go", kafkaBin}, {"franz-go", kgoBin}} {
		t.Run(c.name, func(t *testing.T) {
			r := newUpgradeRig(t, needKafka(t), c.bin)
			r.host = true
			r.flags[1] = "1h" // --idle: the test asks for each sleep
			r.start()
			r.s.waitState("running", 90*time.Second)
			r.work(4)
			r.s.stop(syscall.SIGKILL)
			r.svc = append(r.svc, "-log-level", "debug")
			r.start()
			r.s.waitState("running", 90*time.Second)
			if n := r.s.countLogs("standby: running", "adopted", "true"); n != 1 {
				t.Fatalf("%d adoptions, want 1", n)
			}
			sleepNow(t, r.dir)
			eventually(t, 90*time.Second, "the service started again", func() (bool, string) {
				n := r.s.countLogs("standby: starting")
				return n == 1, fmt.Sprintf("%d cold starts", n)
			})
			if n := r.s.countLogs("standby: the arguments changed; stopping the service and starting it cold, in place of its checkpoint"); n != 1 {
				t.Errorf("%d lines saying the arguments changed, want 1", n)
			}
			r.s.waitState("running", 90*time.Second)
			r.work(3)
			sleepNow(t, r.dir)
			r.s.waitState("standby", 90*time.Second)
			r.work(3)
			r.checkClean()
		})
	}
}
