package criu

// Integration tests: they run CRIU for real, so they need root and CRIU
// >= 4.2. Without KCR_E2E=1 they skip when either is missing; with
// KCR_E2E=1 they fail instead.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

var (
	progMu    sync.Mutex
	progBins  = map[string]string{}
	helperDir string // where test programs are built; removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if helperDir != "" {
		os.RemoveAll(helperDir)
	}
	os.Exit(code)
}

// needCRIU returns the CRIU binary, or skips (fails with KCR_E2E=1).
func needCRIU(t *testing.T) string {
	t.Helper()
	e2e := os.Getenv("KCR_E2E") == "1"
	stop := t.Skipf
	if e2e {
		stop = t.Fatalf
	}
	if os.Geteuid() != 0 {
		stop("integration test needs root")
	}
	path, err := Find("")
	if err != nil {
		stop("%v", err)
	}
	v, err := ReadVersion(context.Background(), path)
	if err != nil {
		stop("%v", err)
	}
	if !v.AtLeast(4, 2, 0) {
		stop("CRIU %s at %s is older than 4.2", v, path)
	}
	return path
}

// helper builds test/apps/criuhelper once.
func helper(t *testing.T) string {
	t.Helper()
	return testProgram(t, "criuhelper")
}

// testProgram builds test/apps/<name> once per test binary.
func testProgram(t *testing.T, name string) string {
	t.Helper()
	progMu.Lock()
	defer progMu.Unlock()
	if bin, ok := progBins[name]; ok {
		return bin
	}
	if helperDir == "" {
		dir, err := os.MkdirTemp("", "kcr-criu-test-")
		if err != nil {
			t.Fatal(err)
		}
		helperDir = dir
	}
	bin := filepath.Join(helperDir, name)
	out, err := exec.Command("go", "build", "-o", bin, "../test/apps/"+name).CombinedOutput()
	if err != nil {
		t.Fatalf("go build test/apps/%s: %v\n%s", name, err, out)
	}
	progBins[name] = bin
	return bin
}

type target struct {
	pid  int
	dir  string // the target's scratch dir (output, port file)
	out  string // its stdout/stderr (O_APPEND)
	addr string // its listening address, if any
}

// startTarget starts the helper detached (setsid, stdin /dev/null, output
// appended to a file, parent PID 1 via -daemon), with GODEBUG=multipathtcp=0
// unless mptcpDefault. It waits until the helper is ticking.
func startTarget(t *testing.T, mptcpDefault bool, args ...string) *target {
	t.Helper()
	bin := helper(t)
	tg := &target{dir: t.TempDir()}
	tg.out = filepath.Join(tg.dir, "out.log")
	portFile := filepath.Join(tg.dir, "port")
	args = append([]string{"-daemon", "-out", tg.out, "-portfile", portFile}, args...)
	cmd := exec.Command(bin, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GODEBUG=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if !mptcpDefault {
		cmd.Env = append(cmd.Env, "GODEBUG=multipathtcp=0")
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start helper: %v", err)
	}
	tg.pid, err = strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("helper printed %q", out)
	}
	t.Cleanup(func() { tg.kill(t) })
	tg.waitTicks(t, 1)
	if b, err := os.ReadFile(portFile); err == nil {
		tg.addr = string(b)
	}
	return tg
}

// kill kills the target if it (still) is our helper and waits until it is gone.
func (tg *target) kill(t *testing.T) {
	if !strings.Contains(cmdline(tg.pid), helper(t)) {
		return
	}
	syscall.Kill(tg.pid, syscall.SIGKILL)
	if _, err := WaitGone(context.Background(), tg.pid, 10*time.Second); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

var tickRE = regexp.MustCompile(`tick (\d+)`)

// lastTick returns the helper's last counter value.
func (tg *target) lastTick(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(tg.out)
	if err != nil {
		t.Fatal(err)
	}
	m := tickRE.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(string(m[len(m)-1][1]))
	return n
}

// waitTicks waits until the counter passes from+5 (the target is running).
func (tg *target) waitTicks(t *testing.T, from int) {
	t.Helper()
	if !wait.Until(10*time.Second, func() bool { return tg.lastTick(t) >= from+5 }) {
		out, _ := os.ReadFile(tg.out)
		t.Fatalf("process %d stopped ticking at %d (want > %d); output:\n%s", tg.pid, tg.lastTick(t), from+5, out)
	}
}

// ping asks the target's listener for its counter.
func (tg *target) ping(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", tg.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", tg.addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "pong ") {
		t.Fatalf("ping %s: %q, %v", tg.addr, line, err)
	}
}

// fdTable describes the open fds of pid, with socket/pipe/anon inode
// numbers removed (they change across a restore).
func fdTable(t *testing.T, pid int) map[string]string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if i := strings.Index(l, ":["); i >= 0 && !strings.HasPrefix(l, "/") {
			l = l[:i]
		}
		m[e.Name()] = l
	}
	return m
}

func mkdir(t *testing.T, name string) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestE2EVersionAndCheck(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	v, err := ReadVersion(ctx, criu)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := KernelRelease()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckKernel(v, rel); err != nil {
		t.Errorf("CheckKernel: %v", err)
	}
	out, err := Check(ctx, criu)
	if err != nil || !strings.Contains(out, "Looks good") {
		t.Errorf("Check = %q, %v", out, err)
	}
	t.Logf("CRIU %s at %s, kernel %s", v, criu, rel)
}

func TestE2EDumpRestore(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	tg := startTarget(t, false, "-listen", "127.0.0.1:0")
	tg.ping(t)

	if need, err := ShellJobNeeded(tg.pid); err != nil || need {
		t.Fatalf("ShellJobNeeded = %v, %v", need, err)
	}
	// The ping's accepted connection may sit in CLOSE-WAIT for a moment
	// until the target closes its end.
	var p []Problem
	var err error
	wait.Until(2*time.Second, func() bool {
		p, err = Preflight(tg.pid)
		return err != nil || len(p) == 0
	})
	if err != nil || len(p) != 0 {
		t.Fatalf("Preflight = %v, %v", p, err)
	}
	// Only now: the ping's connection is gone from the fd table too.
	fdsBefore := fdTable(t, tg.pid)

	img := mkdir(t, "img")
	res, err := Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img})
	if err != nil {
		t.Fatal(err)
	}
	if res.StatsErr != nil {
		t.Fatal(res.StatsErr)
	}
	st := res.Stats
	if st.PagesScanned == 0 || st.PagesWritten == 0 || st.FrozenTime <= 0 || st.MemdumpTime <= 0 || st.FreezingTime <= 0 {
		t.Errorf("dump stats look empty: %+v", st)
	}
	if res.LogPath != filepath.Join(img, "dump.log") {
		t.Errorf("LogPath = %s", res.LogPath)
	}
	if _, err := os.Stat(filepath.Join(img, StatsDumpFile)); err != nil {
		t.Error(err)
	}
	gone, err := WaitGone(ctx, tg.pid, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump: %v wall, frozen %v, freezing %v, memdump %v, memwrite %v, %d pages written; gone %v later",
		res.Duration, st.FrozenTime, st.FreezingTime, st.MemdumpTime, st.MemwriteTime, st.PagesWritten, gone)
	if err := CheckImagePIDsFree(ctx, img, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	before := tg.lastTick(t)

	work := mkdir(t, "work")
	rr, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	if rr.PID != tg.pid {
		t.Errorf("restored PID %d, want %d", rr.PID, tg.pid)
	}
	if rr.StatsErr != nil || rr.Stats.RestoreTime <= 0 || rr.Stats.PagesRestored == 0 {
		t.Errorf("restore stats %+v, %v", rr.Stats, rr.StatsErr)
	}
	if rr.LogPath != filepath.Join(work, "restore.log") {
		t.Errorf("LogPath = %s", rr.LogPath)
	}
	for _, name := range []string{"restore.log", StatsRestoreFile} {
		if _, err := os.Stat(filepath.Join(work, name)); err != nil {
			t.Errorf("not in the work dir: %v", err)
		}
		if _, err := os.Stat(filepath.Join(img, name)); err == nil {
			t.Errorf("%s written to the images dir", name)
		}
	}
	t.Logf("restore: %v wall, restore_time %v, %d pages restored", rr.Duration, rr.Stats.RestoreTime, rr.Stats.PagesRestored)

	// Detached: not our child.
	pst, err := readProcStat(rr.PID)
	if err != nil {
		t.Fatal(err)
	}
	if pst.PPID == os.Getpid() {
		t.Errorf("restored process is our child")
	}
	if pst.Session != rr.PID {
		t.Errorf("restored process is not a session leader (sid %d)", pst.Session)
	}
	// Nothing of criu or of us leaked into it.
	fdsAfter := fdTable(t, rr.PID)
	if fmt.Sprint(fdsAfter) != fmt.Sprint(fdsBefore) {
		t.Errorf("fds changed across dump/restore:\nbefore %v\nafter  %v", fdsBefore, fdsAfter)
	}
	tg.waitTicks(t, before)
	tg.ping(t)
	ourTime, _ := os.Readlink("/proc/self/ns/time")
	theirTime, _ := os.Readlink("/proc/" + strconv.Itoa(rr.PID) + "/ns/time")
	t.Logf("parent %d, time namespace %s (ours %s)", pst.PPID, theirTime, ourTime)
}

func TestE2ELeaveRunning(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	tg := startTarget(t, false)
	img := mkdir(t, "img")
	res, err := Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img, LeaveRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leave-running dump: %v wall, frozen %v", res.Duration, res.Stats.FrozenTime)
	tg.waitTicks(t, tg.lastTick(t))

	err = CheckImagePIDsFree(ctx, img, 10*time.Millisecond)
	var pe *PIDInUseError
	if !errors.As(err, &pe) || pe.Owner != tg.pid || !strings.Contains(err.Error(), "helper") {
		t.Errorf("CheckImagePIDsFree = %v", err)
	}
	_, err = Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, "work")})
	var ce *Error
	if !errors.As(err, &ce) || ce.Cause != CausePIDInUse || !strings.Contains(ce.First, "File exists") {
		t.Errorf("restore over a running original = %v", err)
	}
	t.Logf("restore over the original: %v", err)
	tg.waitTicks(t, tg.lastTick(t))
}

func TestE2ETCPConnection(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	tg := startTarget(t, false, "-dial", ln.Addr().String(), "-listen", "127.0.0.1:0")

	p, err := Preflight(tg.pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].Cause != CauseTCPEstablished || !strings.Contains(p[0].Desc, "-> "+ln.Addr().String()+" established") {
		t.Fatalf("Preflight = %v", p)
	}
	t.Logf("preflight: %v", p[0])

	img := mkdir(t, "img")
	_, err = Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img})
	var ce *Error
	if !errors.As(err, &ce) || ce.Cause != CauseTCPEstablished || !strings.Contains(ce.Hint, "--tcp-close") {
		t.Fatalf("dump with a TCP connection = %v", err)
	}
	t.Logf("dump error: %v", err)
	tg.waitTicks(t, tg.lastTick(t)) // a failed dump leaves it running

	img = mkdir(t, "img2")
	if _, err := Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img, TCPClose: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := WaitGone(ctx, tg.pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err = Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, "work")})
	if !errors.As(err, &ce) || ce.Cause != CauseTCPCloseNeeded {
		t.Fatalf("restore without TCPClose = %v", err)
	}
	t.Logf("restore error: %v", err)
	before := tg.lastTick(t)
	rr, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, "work"), TCPClose: true})
	if err != nil {
		t.Fatal(err)
	}
	if rr.PID != tg.pid {
		t.Errorf("restored PID %d, want %d", rr.PID, tg.pid)
	}
	tg.waitTicks(t, before)
	tg.ping(t) // the listener survives --tcp-close
}

func TestE2EMPTCP(t *testing.T) {
	criu := needCRIU(t)
	if !mptcpEnabled() {
		t.Skip("MPTCP disabled in this kernel (net.mptcp.enabled)")
	}
	tg := startTarget(t, true, "-listen", "127.0.0.1:0") // Go's default: MPTCP
	p, err := Preflight(tg.pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].Cause != CauseMPTCP || !strings.Contains(p[0].Desc, "MPTCP "+tg.addr+" listening") {
		t.Fatalf("Preflight = %v (is Go's default no longer MPTCP?)", p)
	}
	t.Logf("preflight: %v", p[0])
	_, err = Dump(context.Background(), criu, DumpOptions{PID: tg.pid, ImagesDir: mkdir(t, "img")})
	var ce *Error
	if !errors.As(err, &ce) || ce.Cause != CauseMPTCP || !strings.Contains(err.Error(), "GODEBUG=multipathtcp=0") {
		t.Fatalf("dump of an MPTCP listener = %v", err)
	}
	t.Logf("dump error: %v", err)
	tg.waitTicks(t, tg.lastTick(t))
}

func TestE2EExternalUnixSocket(t *testing.T) {
	criu := needCRIU(t)
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	tg := startTarget(t, false, "-unix", sock)
	defer (<-accepted).Close()

	p, err := Preflight(tg.pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].Cause != CauseExternalUnix || !strings.Contains(p[0].Desc, sock) {
		t.Fatalf("Preflight = %v", p)
	}
	t.Logf("preflight: %v", p[0])
	_, err = Dump(context.Background(), criu, DumpOptions{PID: tg.pid, ImagesDir: mkdir(t, "img")})
	var ce *Error
	if !errors.As(err, &ce) || ce.Cause != CauseExternalUnix {
		t.Fatalf("dump with an external Unix socket = %v", err)
	}
	t.Logf("dump error: %v", err)
	tg.waitTicks(t, tg.lastTick(t))
}

func TestE2ENotifyCancelAndLeaks(t *testing.T) {
	criu := needCRIU(t)
	tg := startTarget(t, false)

	// Hooks run in order; children started meanwhile inherit nothing of
	// the swrk connection.
	var scripts []string
	var childFDs string
	_, err := Dump(context.Background(), criu, DumpOptions{PID: tg.pid, ImagesDir: mkdir(t, "img"), LeaveRunning: true,
		Notify: func(script string, pid int) error {
			scripts = append(scripts, script)
			if script == "pre-dump" {
				out, err := exec.Command("ls", "-l", "/proc/self/fd").Output()
				if err != nil {
					return err
				}
				childFDs = string(out)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(scripts, ","); !strings.HasPrefix(s, "pre-dump") || !strings.HasSuffix(s, "post-dump") {
		t.Errorf("scripts %v", scripts)
	}
	if strings.Contains(childFDs, "socket:") || strings.Contains(childFDs, "memfd:") {
		t.Errorf("a child started during the dump inherited criu's fds:\n%s", childFDs)
	}

	// A failing hook fails the dump and leaves the target running.
	_, err = Dump(context.Background(), criu, DumpOptions{PID: tg.pid, ImagesDir: mkdir(t, "img"), LeaveRunning: true,
		Notify: func(script string, pid int) error {
			if script == "post-dump" {
				return errors.New("hook says no")
			}
			return nil
		}})
	if err == nil || !strings.Contains(err.Error(), "hook says no") && !strings.Contains(fmt.Sprint(errors.Unwrap(err)), "hook says no") {
		t.Errorf("dump with a failing hook = %v", err)
	}
	t.Logf("failing hook: %v", err)
	tg.waitTicks(t, tg.lastTick(t))

	// Cancelling hangs up on criu; caught before the freeze, the target is
	// fine.
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	_, err = Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: mkdir(t, "img"),
		Notify: func(script string, pid int) error {
			if script == "pre-dump" {
				cancel()
				time.Sleep(50 * time.Millisecond)
			}
			return nil
		}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled dump = %v", err)
	}
	t.Logf("cancelled: %v", err)
	if time.Since(start) > 5*time.Second {
		t.Errorf("cancelled dump took %v", time.Since(start))
	}
	tg.waitTicks(t, tg.lastTick(t))
}

// TestE2ERestoreCancelled: a restore cancelled after CRIU forked the tree
// (here during its post-restore notification, when every task has its
// memory back) stops: CRIU is left to abort and kill what it restored, so
// no half-restored task keeps the image's PID. (Killing CRIU instead left
// the task waiting in CRIU's restorer for good.)
func TestE2ERestoreCancelled(t *testing.T) {
	criu := needCRIU(t)
	tg := startTarget(t, false)
	img := tg.dumpGone(t, criu)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forked := false
	_, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, "work"),
		Notify: func(script string, pid int) error {
			if script == "post-restore" {
				forked = restoring(tg.pid)
				cancel()
			}
			return nil
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled restore = %v", err)
	}
	if !forked {
		t.Fatal("the task was not CRIU's child at post-restore")
	}
	if _, err := WaitGone(context.Background(), tg.pid, 10*time.Second); err != nil {
		t.Fatalf("the half-restored task stayed: %v", err)
	}
}

// A CRIU started ahead of its restore (StartRestore) restores as one
// started by Restore itself; one started for a shell job is closed and
// replaced; an unused one is gone after Close. The notifications come in
// CRIU's order, and the restore returns at CRIU's answer with its stats.
func TestE2ERestoreEarlySession(t *testing.T) {
	criu := needCRIU(t)
	ctx := context.Background()
	for _, shellJob := range []bool{false, true} {
		tg := startTarget(t, false)
		img := mkdir(t, fmt.Sprintf("img-%v", shellJob))
		if _, err := Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img}); err != nil {
			t.Fatal(err)
		}
		if _, err := WaitGone(ctx, tg.pid, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		before := tg.lastTick(t)
		rs, err := StartRestore(ctx, criu, shellJob)
		if err != nil {
			t.Fatal(err)
		}
		early := rs.s.cmd.Process.Pid
		rr, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: mkdir(t, fmt.Sprintf("work-%v", shellJob)), Session: rs})
		if err != nil {
			t.Fatalf("shell job %v: %v", shellJob, err)
		}
		if rr.PID != tg.pid || rr.Stats == nil || rr.Stats.PagesRestored == 0 {
			t.Errorf("shell job %v: PID %d (want %d), stats %+v, %v", shellJob, rr.PID, tg.pid, rr.Stats, rr.StatsErr)
		}
		var scripts []string
		for _, st := range rr.Stages {
			scripts = append(scripts, st.Script)
		}
		if got := strings.Join(scripts, " "); !strings.HasPrefix(got, "pre-restore ") || !strings.Contains(got, " post-restore ") {
			t.Errorf("notifications %q", got)
		}
		rr.Wait()
		if rs.s != nil {
			t.Errorf("shell job %v: the session was neither taken nor closed", shellJob)
		}
		// The early CRIU is gone either way: it restored, or it was
		// closed for the other kind of restore.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", early)); err == nil {
			t.Errorf("shell job %v: early CRIU %d still there", shellJob, early)
		}
		tg.waitTicks(t, before)
	}

	rs, err := StartRestore(ctx, criu, false)
	if err != nil {
		t.Fatal(err)
	}
	pid := rs.s.cmd.Process.Pid
	rs.Close()
	rs.Close()
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("unused CRIU %d still there after Close", pid)
	}
}

// dumpGone dumps the target into a new images directory, which it returns,
// once the target is gone (CRIU killed it).
func (tg *target) dumpGone(t *testing.T, criu string) string {
	t.Helper()
	img := mkdir(t, "img")
	if _, err := Dump(context.Background(), criu, DumpOptions{PID: tg.pid, ImagesDir: img}); err != nil {
		t.Fatal(err)
	}
	if _, err := WaitGone(context.Background(), tg.pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return img
}
