// Package e2e runs kcr end to end: real CRIU, real processes, and (for the
// Kafka tests) a real Apache Kafka broker. In CI (CI=true) or with KCR_E2E=1
// a missing CRIU, root or broker fails the tests; elsewhere they are skipped.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

var (
	binDir   string // kcr and test programs, mode 0755
	kcrBin   string
	appBin   string
	kafkaBin string // kafkaapp, for kafka_test.go
	kgoBin   string // kgoapp, for kgo_test.go
	setupOK  bool
	setupErr string
)

func required() bool { return os.Getenv("CI") == "true" || os.Getenv("KCR_E2E") == "1" }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kcr-e2e-bin-")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755)
	binDir = dir
	kcrBin = filepath.Join(dir, "kcr")
	appBin = filepath.Join(dir, "testapp")
	kafkaBin = filepath.Join(dir, "kafkaapp")
	kgoBin = filepath.Join(dir, "kgoapp")
	setupOK = true
	for _, b := range [][2]string{{kcrBin, "../../cmd/kcr"}, {filepath.Join(dir, "kcr-hook"), "../../cmd/kcr-hook"}, {appBin, "../apps/testapp"}, {kafkaBin, "../apps/kafkaapp"}, {kgoBin, "../apps/kgoapp"}} {
		// kcrtest: kcr obeys the KCR_TEST_STALL_* variables that stall it
		// between phases, so that tests can kill it there.
		out, err := exec.Command("go", "build", "-tags", "kcrtest", "-o", b[0], b[1]).CombinedOutput()
		if err != nil {
			setupOK, setupErr = false, fmt.Sprintf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	if setupOK && os.Geteuid() != 0 {
		setupOK, setupErr = false, "e2e tests need root (CRIU)"
	}
	if setupOK {
		doctor := kcrOpts{}.cmd("doctor")
		if out, err := doctor.CombinedOutput(); err != nil {
			setupOK, setupErr = false, fmt.Sprintf("kcr doctor failed (run scripts/install-criu.sh):\n%s", out)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// need fails or skips the test when the environment cannot run it.
func need(t *testing.T) {
	t.Helper()
	if setupOK {
		return
	}
	if required() {
		t.Fatalf("e2e environment missing: %s", setupErr)
	}
	t.Skipf("e2e environment missing (set KCR_E2E=1 to make this fatal): %s", setupErr)
}

// app is a started testapp.
type app struct {
	t      *testing.T
	cmd    *exec.Cmd
	pid    int
	out    string // its event log
	listen string
	sock   string
	done   chan struct{}

	logMu  sync.Mutex
	logOff int64   // bytes of out parsed into logEvs
	logEvs []event // events parsed so far
}

type event map[string]any

func (e event) str(k string) string { s, _ := e[k].(string); return s }

// echoServer accepts connections and echoes; it counts accepts.
type echoServer struct {
	ln      net.Listener
	mu      sync.Mutex
	accepts int
}

func newEcho(t *testing.T) *echoServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.accepts++
			e.mu.Unlock()
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					c.Write(buf[:n])
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return e
}

func (e *echoServer) addr() string { return e.ln.Addr().String() }
func (e *echoServer) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.accepts
}

// startEchoApp starts testapp with an outbound connection to a new echo
// server, and lets it run a moment: the connection is open, the worker has
// ticked. It fails or skips the test without CRIU and root.
func startEchoApp(t *testing.T) (*echoServer, *app) {
	t.Helper()
	need(t)
	echo := newEcho(t)
	a := startApp(t, "-echo", echo.addr())
	time.Sleep(300 * time.Millisecond)
	return echo, a
}

// startApp starts testapp detached: own session, stdin /dev/null, output to
// an O_APPEND file, MPTCP off unless asked for.
func startApp(t *testing.T, args ...string) *app {
	t.Helper()
	return startProg(t, appBin, args...)
}

// startProg starts bin like startApp starts testapp; bin must log a "ready"
// event with "listen" and "socket" (or "fatal") like testapp.
func startProg(t *testing.T, bin string, args ...string) *app {
	t.Helper()
	dir := t.TempDir()
	outPath := filepath.Join(dir, "app.log")
	f, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), "GODEBUG=multipathtcp=0", "KCR_SOCKET_DIR="+filepath.Join(dir, "sock"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &app{t: t, cmd: cmd, pid: cmd.Process.Pid, out: outPath, done: make(chan struct{})}
	// Reap it as soon as it exits: a dump kills it, and kcr waits for the
	// PID to be free.
	go func() { cmd.Wait(); close(a.done) }()
	t.Cleanup(func() { a.kill() })
	// Generous: a 1 GiB heap is filled before "ready", slowly under load.
	ev := a.waitEvent(60*time.Second, func(e event) bool { return e["ev"] == "ready" || e["ev"] == "fatal" })
	if ev["ev"] == "fatal" {
		t.Fatalf("%s failed to start: %v", filepath.Base(bin), ev)
	}
	a.listen, a.sock = ev.str("listen"), ev.str("socket")
	return a
}

func (a *app) kill() {
	syscall.Kill(a.pid, syscall.SIGKILL)
}

// events returns all events logged so far (by every incarnation: restored
// copies append to the same file). It parses only what was appended since
// the last call.
func (a *app) events() []event {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	f, err := os.Open(a.out)
	if err != nil {
		return slices.Clip(a.logEvs)
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, a.logOff, 1<<62))
	// Only whole lines: the app may be in the middle of writing one.
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	a.logOff += int64(len(b))
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			a.logEvs = append(a.logEvs, e)
		}
	}
	return slices.Clip(a.logEvs)
}

// waitEvent waits for an event matching ok and returns it.
func (a *app) waitEvent(timeout time.Duration, ok func(event) bool) event {
	a.t.Helper()
	var found event
	if !wait.Until(timeout, func() bool {
		evs := a.events()
		i := slices.IndexFunc(evs, ok)
		if i >= 0 {
			found = evs[i]
		}
		return i >= 0
	}) {
		b, _ := os.ReadFile(a.out)
		a.t.Fatalf("timed out after %v waiting for an event; app log:\n%s", timeout, b)
	}
	return found
}

// since returns events after the n-th.
func (a *app) since(n int) []event {
	evs := a.events()
	if n > len(evs) {
		return nil
	}
	return evs[n:]
}

// state asks the app's TCP listener for its counter, generation and instance id.
// checkRestoredState asserts that the testapp at addr, restored from an
// image taken when its state was c0, gen0, id0, kept its counter, counts one
// restore more, has a new instance id, and that its worker goroutine runs.
func checkRestoredState(t *testing.T, addr string, c0 int64, gen0 uint64, id0 string) {
	t.Helper()
	c1, gen1, id1 := state(t, addr)
	if c1 < c0 || gen1 != gen0+1 || id1 == id0 {
		t.Fatalf("state after restore: counter %d (was %d), gen %d (was %d), id %s (was %s)", c1, c0, gen1, gen0, id1, id0)
	}
	time.Sleep(200 * time.Millisecond)
	if c2, _, _ := state(t, addr); c2 <= c1 {
		t.Fatalf("worker goroutine stopped: counter %d then %d", c1, c2)
	}
}

func state(t *testing.T, addr string) (counter int64, gen uint64, id string) {
	t.Helper()
	askState(t, addr, "state listener", func(line []byte) error {
		f := strings.Fields(string(line))
		if len(f) != 3 {
			return fmt.Errorf("answer %q, want \"counter generation id\"", line)
		}
		counter, _ = strconv.ParseInt(f[0], 10, 64)
		gen, _ = strconv.ParseUint(f[1], 10, 64)
		id = f[2]
		return nil
	})
	return counter, gen, id
}

// askState reads one line from the state listener of a test program at addr
// and hands it to parse. It tries 50 times, 50 ms apart, while the dial, the
// read or parse fails (a restored program may not listen yet), then fails t.
func askState(t *testing.T, addr, what string, parse func(line []byte) error) {
	t.Helper()
	var lastErr error
	for range 50 {
		lastErr = func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			line, err := bufio.NewReader(c).ReadBytes('\n')
			if err != nil {
				return err
			}
			return parse(line)
		}()
		if lastErr == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s %s: %v", what, addr, lastErr)
}

// kcrResult is one run of the kcr binary.
type kcrResult struct {
	code   int
	stdout string
	stderr string
}

// kcrOpts says how an e2e test runs the kcr binary: runKCR for a run to its
// end, kcrOpts.cmd for one the test starts, pipes or kills itself.
type kcrOpts struct {
	dir  string   // kcr's working directory ("": the test's)
	env  []string // added to the test's environment
	log  kcrLog   // when runKCR logs what kcr printed
	must bool     // fail the test unless kcr exits 0; the run is logged
}

type kcrLog int

const (
	logNone   kcrLog = iota // the caller logs what it needs
	logAll                  // every run
	logFailed               // a run that exits non-zero
)

// cmd is kcr with args, not started.
func (o kcrOpts) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(kcrBin, args...)
	cmd.Dir = o.dir
	if o.env != nil {
		cmd.Env = append(os.Environ(), o.env...)
	}
	return cmd
}

// runKCR runs kcr with args as o says and returns its exit code and output.
func runKCR(t *testing.T, o kcrOpts, args ...string) kcrResult {
	t.Helper()
	cmd := o.cmd(args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := kcrResult{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run kcr: %v", err)
	}
	if o.must || o.log == logAll || o.log == logFailed && r.code != 0 {
		r.log(t, args)
	}
	if o.must && r.code != 0 {
		t.Fatalf("kcr %s: exit %d: %s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r
}

func (r kcrResult) log(t *testing.T, args []string) {
	t.Helper()
	t.Logf("kcr %s -> exit %d\n%s%s", strings.Join(args, " "), r.code, r.stderr, r.stdout)
}

// restore runs kcr restore --json and returns the new PID, killed at cleanup.
// out is the one entry of the output's "restores".
func restore(t *testing.T, image string, extra ...string) (pid int, out map[string]any) {
	t.Helper()
	r := runKCR(t, kcrOpts{must: true}, append([]string{"restore", "--json", image}, extra...)...)
	out = oneRestore(t, r.stdout)
	pid = int(out["pid"].(float64))
	t.Cleanup(func() { killWait(pid) })
	return pid, out
}

// oneRestore returns the only entry of kcr restore --json's "restores".
func oneRestore(t *testing.T, stdout string) map[string]any {
	t.Helper()
	var doc struct {
		Restores []map[string]any `json:"restores"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil || len(doc.Restores) != 1 {
		t.Fatalf("kcr restore --json: want one entry in restores: %v: %q", err, stdout)
	}
	return doc.Restores[0]
}

// killWait kills pid and waits until it is gone (PID 1 reaps restored
// processes, sometimes slowly).
func killWait(pid int) {
	syscall.Kill(pid, syscall.SIGKILL)
	wait.Until(5*time.Second, func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return err != nil
	})
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z'
}

func names(evs []event, kind string) []string {
	var out []string
	for _, e := range evs {
		if e["ev"] == kind {
			out = append(out, e.str("name"))
		}
	}
	return out
}
