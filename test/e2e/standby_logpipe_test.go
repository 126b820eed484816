package e2e

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// launchStandbyStdio starts kcr standby with --log -, as init of its own PID
// namespace (a pod's entrypoint), its stdout to outPath and its stderr to
// the sbRun's errLog.
func launchStandbyStdio(t *testing.T, dir, outPath string, flags []string, svc ...string) *sbRun {
	t.Helper()
	s := &sbRun{t: t, k: &kafkaEnv{t: t}, init: true, dir: dir, errLog: dir + ".standby.log"}
	errf, err := os.OpenFile(s.errLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	outf, err := os.OpenFile(outPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer outf.Close()
	args := append([]string{"standby", "--image-dir", dir, "--log", "-"}, flags...)
	args = append(append(args, "--"), svc...)
	s.cmd = exec.Command("unshare", append([]string{"--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", kcrBin}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = outf, errf
	s.start()
	return s
}

// logLines are the "logline N STREAM PAD" lines of testapp -log-rate in a
// file, in order; a line that holds "logline" but is not one whole is
// returned in bad.
func logLines(t *testing.T, path, stream string) (seqs []int, bad []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pad, long := strings.Repeat("x", 80), strings.Repeat("y", 8<<10)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "logline") {
			continue
		}
		p := strings.Split(line, " ")
		n, err := strconv.Atoi(p[min(1, len(p)-1)])
		if len(p) != 4 || p[0] != "logline" || err != nil || p[2] != stream || (p[3] != pad && p[3] != long) || (p[3] == long) != (n%1000 == 999) {
			bad = append(bad, line[:min(len(line), 120)])
			continue
		}
		seqs = append(seqs, n)
	}
	return seqs, bad
}

// The service's stdout and stderr reach kcr standby's own through pipes
// (--log -), across checkpoints and restores: a service writing 2,000
// lines a second through five sleep/wake cycles, every line whole (some
// longer than PIPE_BUF), in order, none lost or repeated, and the restored
// copies' own lines among them.
func TestStandbyLogPipe(t *testing.T) {
	need(t)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	dir := filepath.Join(t.TempDir(), "img")
	outPath := dir + ".stdout"
	s := launchStandbyStdio(t, dir, outPath, []string{"--idle", "1s", "--listen", addr}, appBin, "-listen-fds", "-log-rate", "2000")
	const cycles = 5
	for cycle := 1; cycle <= cycles; cycle++ {
		s.waitState("standby", 60*time.Second)
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}
		c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatalf("cycle %d: no answer: %v", cycle, err)
		}
		c.Close()
	}
	s.waitState("standby", 60*time.Second)
	if _, err := s.term(60 * time.Second); err != nil {
		t.Fatalf("kcr standby exited with %v on SIGTERM", err)
	}

	out, badOut := logLines(t, outPath, "out")
	errs, badErr := logLines(t, s.errLog, "err")
	if bad := append(badOut, badErr...); len(bad) > 0 {
		t.Fatalf("%d lines cut or mixed, the first: %q", len(bad), bad[0])
	}
	for name, seqs := range map[string][]int{"stdout": out, "stderr": errs} {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("%s: line %d after line %d", name, seqs[i], seqs[i-1])
			}
		}
	}
	seen := map[int]bool{}
	last := -1
	for _, n := range append(out, errs...) {
		seen[n] = true
		last = max(last, n)
	}
	var missing []int
	for n := 0; n <= last; n++ {
		if !seen[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 || last < 1000 {
		t.Fatalf("%d lines (the last %d), %d missing (the first: %v)", len(seen), last, len(missing), missing[:min(len(missing), 10)])
	}
	// The restored copies wrote to kcr standby's stdout: testapp's
	// after-restore events are JSON lines there.
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	restores := strings.Count(string(b), `"kind":"restore"`) / 3 // one per hook (state, conn, worker)
	if restores < cycles {
		t.Errorf("%d restored copies wrote their after-restore events to kcr standby's stdout, want %d", restores, cycles)
	}
	t.Logf("%d lines, %d on stdout, %d on stderr, %d restores", len(seen), len(out), len(errs), restores)
}
