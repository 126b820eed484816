package criu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

func TestParseLog(t *testing.T) {
	for _, tc := range []struct {
		file  string
		first string
		cause Cause
	}{
		{"tcp-established.log", "inet: Connected TCP socket, consider using --tcp-established option.", CauseTCPEstablished},
		{"mptcp.log", "inet: Unsupported proto 262 for socket b754", CauseMPTCP},
		{"unix-external.log", "unix: External socket is used. Consider using --ext-unix-sk option.", CauseExternalUnix},
		{"pid-in-use.log", "Can't fork for 20923: File exists", CausePIDInUse},
		{"shell-job.log", "The root process 20979 is not a session leader. Consider using --shell-job option", CauseShellJob},
		{"no-such-process.log", "Unable to detach from 999999: No such process", CauseNoProcess},
		{"tcp-close-needed.log", "Need to set the --tcp-close options.", CauseTCPCloseNeeded},
		{"dump-ok.log", "", CauseUnknown}, // only the harmless rlimit error
		// Errors of restored tasks carry their PID: "     1: Error (...)".
		{"unix-bind-race.log", "unix: Can't bind id 0xb ino 198309 addr /tmp/rt/sock2/kcr-5253.sock: Address already in use", CauseUnixBindInUse},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata/logs", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			first, hint := ParseLog(f)
			if first != tc.first {
				t.Errorf("first = %q, want %q", first, tc.first)
			}
			if hint != tc.cause.Hint() {
				t.Errorf("hint = %q, want %q", hint, tc.cause.Hint())
			}
			if _, c := parseLogFile(filepath.Join("testdata/logs", tc.file)); c != tc.cause {
				t.Errorf("cause = %q, want %q", c, tc.cause)
			}
		})
	}
	if first, hint := ParseLogFile("testdata/logs/does-not-exist"); first != "" || hint != "" {
		t.Errorf("missing log: %q %q", first, hint)
	}
}

// TestClassifyLines: the causes known from single error lines of CRIU's
// logs (restore errors of clones racing for a path, a lazy-pages daemon's
// restore going away).
func TestClassifyLines(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Cause
	}{
		{"(00.267623)      1: Error (criu/sk-unix.c:1651): unix: Can't bind id 0xb ino 198309 addr /run/kcr/kcr-7.sock: Address already in use", CauseUnixBindInUse},
		{"(00.267623)      1: Error (criu/util.c:1087): Unable to change [-100]//run/kcr/kcr-7.sock ownership to (0, 0): No such file or directory", CauseFileVanished},
		{"(00.082114)      1: Error (criu/util.c:1094): Unable to stat [-100]//tmp/x/sock/kcr-24921.sock: No such file or directory", CauseFileVanished},
		{"(00.100000) Error (criu/uffd.c:4): uffd: PID recv: short read", CauseRestoreGone},
		{"(00.100000) Error (criu/uffd.c:9): uffd: Restorer unexpectedly closed the connection", CauseRestoreGone},
		{"(00.267623)      1: Error (criu/util.c:1087): Unable to change [-100]//run/kcr/kcr-7.sock ownership to (0, 0): Operation not permitted", CausePermission},
		{"(00.100000) Error (criu/sk-unix.c:1651): unix: Can't bind id 0xb: Permission denied", CausePermission},
		{"(00.052123)      1: Error (criu/image.c:402): Unable to open pstree.img: No space left on device", CauseDiskFull},
		{"(00.052123) Error (criu/log.c:100): Can't write log: Disk quota exceeded", CauseDiskFull},
	} {
		if _, got := parseLog(strings.NewReader(tc.line + "\n")); got != tc.want {
			t.Errorf("%q: cause %q, want %q", tc.line, got, tc.want)
		}
	}
	// A specific cause anywhere in the log wins over the lazy-pages
	// daemon's report that the restore went away.
	log := "(00.1) Error (criu/uffd.c:4): uffd: PID recv: short read\n(00.2) Error (criu/x.c:1): Can't fork for 77: File exists\n"
	if _, got := parseLog(strings.NewReader(log)); got != CausePIDInUse {
		t.Errorf("cause %q, want %q", got, CausePIDInUse)
	}
}

// TestErrorIsCause: errors.Is finds an *Error's cause through wrapping, and
// nothing else.
func TestErrorIsCause(t *testing.T) {
	err := fmt.Errorf("restore clone 2: %w", &Error{Op: "restore", Cause: CauseUnixBindInUse, Err: errors.New("exit status 1")})
	if !errors.Is(err, CauseUnixBindInUse) {
		t.Errorf("errors.Is(%v, %s) = false", err, CauseUnixBindInUse)
	}
	if errors.Is(err, CausePIDInUse) || errors.Is(err, CauseUnknown) {
		t.Errorf("%v matches a cause it does not have", err)
	}
	if errors.Is(&Error{Op: "dump"}, CauseUnknown) {
		t.Error("an *Error without a cause matches CauseUnknown")
	}
	if errors.Is(errors.New("Address already in use"), CauseUnixBindInUse) {
		t.Error("a plain error matches a CRIU cause")
	}
}

func TestParseLogHintWordings(t *testing.T) {
	for cause, want := range map[Cause]string{
		CauseTCPEstablished: "--tcp-close",
		CauseMPTCP:          "GODEBUG=multipathtcp=0",
		CauseExternalUnix:   "Unix socket",
		CausePermission:     "CAP_CHECKPOINT_RESTORE",
		CausePIDInUse:       "kcr run",
	} {
		if !strings.Contains(cause.Hint(), want) {
			t.Errorf("%s hint %q lacks %q", cause, cause.Hint(), want)
		}
	}
}

func TestParseOutput(t *testing.T) {
	for _, tc := range []struct {
		file  string
		first string
		cause Cause
	}{
		{"swrk-output-nonroot.txt", "Can't open dir /proc/22975/fd/8: Permission denied", CausePermission},
		{"cli-output-nonroot.txt", "CRIU needs to have the CAP_SYS_ADMIN or the CAP_CHECKPOINT_RESTORE capability", CausePermission},
	} {
		b, err := os.ReadFile(filepath.Join("testdata/logs", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		first, cause := parseOutput(string(b))
		if first != tc.first || cause != tc.cause {
			t.Errorf("%s: got %q %q, want %q %q", tc.file, first, cause, tc.first, tc.cause)
		}
	}
}

func TestErrorString(t *testing.T) {
	e := newError("dump", "testdata/logs/tcp-established.log", "", errors.New("CRIU reported failure"))
	want := "criu dump failed: inet: Connected TCP socket, consider using --tcp-established option. (log: testdata/logs/tcp-established.log); hint: " + CauseTCPEstablished.Hint()
	if e.Error() != want {
		t.Errorf("got  %s\nwant %s", e.Error(), want)
	}
	if e.Cause != CauseTCPEstablished {
		t.Errorf("cause %q", e.Cause)
	}
	e = newError("restore", "/nonexistent/restore.log", "", errors.New("criu swrk: exit status 1"))
	if got := e.Error(); got != "criu restore failed: criu swrk: exit status 1" {
		t.Errorf("got %q", got)
	}
	var ce *Error
	if !errors.As(error(e), &ce) || ce.Op != "restore" {
		t.Error("errors.As failed")
	}
	if strings.Contains(joinErrors([]error{errors.New("a"), errors.New("b")}).Error(), "\n") {
		t.Error("joined error spans lines")
	}
}

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Version
		ok   bool
	}{
		{"Version: 4.2\n", Version{Major: 4, Minor: 2}, true},
		{"Version: 4.2.1\n", Version{Major: 4, Minor: 2, Sublevel: 1}, true},
		{"Version: 3.17.1\nGitID: v3.17.1-5-gabcdef\n", Version{3, 17, 1, "v3.17.1-5-gabcdef"}, true},
		{"Version: 4.1\nGitID: v4.1-rc1\n", Version{4, 1, 0, "v4.1-rc1"}, true},
		{"criu: command not found\n", Version{}, false},
		{"Version: banana\n", Version{}, false},
	} {
		got, err := ParseVersion(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseVersion(%q) = %+v, %v; want %+v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if s := (Version{Major: 4, Minor: 2, Sublevel: 1}).String(); s != "4.2.1" {
		t.Errorf("String = %q", s)
	}
	if s := (Version{Major: 4, Minor: 2}).String(); s != "4.2" {
		t.Errorf("String = %q", s)
	}
}

func TestCheckKernel(t *testing.T) {
	v := func(s string) Version {
		v, err := ParseVersion("Version: " + s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		criu, kernel string
		ok           bool
		mention      string
	}{
		{"4.2", "6.18.44-fc-v1098", true, ""},
		{"4.2.1", "6.16.0", true, ""},
		{"4.1.1", "6.16.0", false, "TCP"},
		{"4.1", "6.15.9", true, ""},
		{"4.0", "6.13.0-rc1", true, ""},
		{"3.19", "6.13.0", false, "vDSO"},
		{"3.17.1", "6.18.0", false, "vDSO"},
		{"3.17.1", "6.12.30", true, ""},
		{"3.17.1", "5.10.0-28-amd64", true, ""},
		{"3.17.1", "7.0", false, "TCP"},
	} {
		err := CheckKernel(v(tc.criu), tc.kernel)
		if (err == nil) != tc.ok {
			t.Errorf("CheckKernel(%s, %s) = %v, want ok=%v", tc.criu, tc.kernel, err, tc.ok)
			continue
		}
		if err != nil && (!strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "scripts/install-criu.sh")) {
			t.Errorf("CheckKernel(%s, %s) = %v: should mention %q and the install script", tc.criu, tc.kernel, err, tc.mention)
		}
	}
	if err := CheckKernel(v("4.2"), "garbage"); err == nil {
		t.Error("garbage kernel release accepted")
	}
	rel, err := KernelRelease()
	if err != nil || rel == "" {
		t.Fatalf("KernelRelease() = %q, %v", rel, err)
	}
}

func writeExe(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestFind(t *testing.T) {
	dir := t.TempDir()
	explicit := filepath.Join(dir, "explicit-criu")
	env := filepath.Join(dir, "env-criu")
	writeExe(t, explicit)
	writeExe(t, env)
	pathDir := filepath.Join(dir, "path")
	fbDir := filepath.Join(dir, "fallback")
	for _, d := range []string{pathDir, fbDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	noexec := filepath.Join(dir, "noexec")
	if err := os.WriteFile(noexec, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	old := fallbackDirs
	fallbackDirs = []string{fbDir}
	t.Cleanup(func() { fallbackDirs = old })
	t.Setenv("PATH", pathDir)
	t.Setenv(EnvCRIU, env)

	check := func(explicit, want string) {
		t.Helper()
		got, err := Find(explicit)
		if err != nil || got != want {
			t.Errorf("Find(%q) = %q, %v; want %q", explicit, got, err, want)
		}
	}
	check(explicit, explicit) // explicit beats env
	check("", env)            // env beats PATH
	t.Setenv(EnvCRIU, "")
	writeExe(t, filepath.Join(fbDir, "criu"))
	check("", filepath.Join(fbDir, "criu")) // fallback dirs when not on PATH
	writeExe(t, filepath.Join(pathDir, "criu"))
	check("", filepath.Join(pathDir, "criu")) // PATH beats fallback dirs

	for _, bad := range []string{noexec, filepath.Join(dir, "missing"), dir} {
		if _, err := Find(bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("Find(%q) = %v, want ErrNotFound", bad, err)
		}
	}
	t.Setenv(EnvCRIU, noexec)
	if _, err := Find(""); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), EnvCRIU) {
		t.Errorf("bad $%s: %v", EnvCRIU, err)
	}
	t.Setenv(EnvCRIU, "")
	os.Remove(filepath.Join(pathDir, "criu"))
	os.Remove(filepath.Join(fbDir, "criu"))
	_, err := Find("")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Find with nothing installed = %v", err)
	}
	for _, want := range []string{"criu not found", "scripts/install-criu.sh", "--criu PATH", EnvCRIU} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	st, err := parseProcStat([]byte("1234 (a) (b c)) S 1 1234 1234 34817 1234 4194560 1 0 0 0 0 0 0 0 20 0 1 0 99887766 1 2 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Comm != "a) (b c)" || st.State != 'S' || st.PPID != 1 || st.Session != 1234 || st.TTYNr != 34817 || st.StartTime != 99887766 {
		t.Errorf("parsed %+v", st)
	}
	if _, err := parseProcStat([]byte("garbage")); err == nil {
		t.Error("garbage accepted")
	}
}

func TestShellJobNeeded(t *testing.T) {
	// go test runs us inside someone else's session.
	need, err := ShellJobNeeded(os.Getpid())
	if err != nil || !need {
		t.Errorf("ShellJobNeeded(self) = %v, %v; want true", need, err)
	}
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// Setsid happens in the child before exec; wait until it shows.
	wait.Until(5*time.Second, func() bool {
		need, err = ShellJobNeeded(cmd.Process.Pid)
		return err == nil && !need
	})
	if err != nil || need {
		t.Errorf("ShellJobNeeded(setsid child) = %v, %v; want false", need, err)
	}
	if _, err := ShellJobNeeded(freePID(t)); err == nil {
		t.Error("ShellJobNeeded(free PID) did not fail")
	}
}

// freePID returns a PID no process or thread has right now.
func freePID(t *testing.T) int {
	t.Helper()
	for pid := 4194000; pid > 1000; pid -= 997 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			return pid
		}
	}
	t.Fatal("no free PID found")
	return 0
}

func TestWaitGoneAndCheckPIDFree(t *testing.T) {
	ctx := context.Background()
	free := freePID(t)
	if d, err := WaitGone(ctx, free, time.Second); err != nil || d != 0 {
		t.Errorf("WaitGone(free) = %v, %v", d, err)
	}
	if err := CheckPIDFree(ctx, free, time.Second); err != nil {
		t.Errorf("CheckPIDFree(free) = %v", err)
	}

	// A live process holds its PID.
	err := CheckPIDFree(ctx, os.Getpid(), 10*time.Millisecond)
	var pe *PIDInUseError
	if !errors.As(err, &pe) || !errors.Is(err, ErrPIDInUse) || pe.Owner != os.Getpid() {
		t.Fatalf("CheckPIDFree(self) = %v", err)
	}
	for _, want := range []string{"PID " + strconv.Itoa(os.Getpid()) + " is in use by", "cmdline", "kcr run"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	// So does a thread: thread IDs share the PID space.
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if tid == os.Getpid() {
			continue
		}
		err := CheckPIDFree(ctx, tid, 0)
		if !errors.As(err, &pe) || pe.Owner != os.Getpid() || !strings.Contains(err.Error(), "a thread of process") {
			t.Errorf("CheckPIDFree(thread %d) = %v", tid, err)
		}
		break
	}

	// A zombie that is reaped while we wait frees its PID.
	reaped := exec.Command("true")
	if err := reaped.Start(); err != nil {
		t.Fatal(err)
	}
	pid := reaped.Process.Pid
	waitZombie(t, pid)
	go func() {
		time.Sleep(100 * time.Millisecond)
		reaped.Wait()
	}()
	if err := CheckPIDFree(ctx, pid, 5*time.Second); err != nil {
		t.Errorf("CheckPIDFree(zombie being reaped) = %v", err)
	}

	// A zombie nobody reaps.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	pid = cmd.Process.Pid
	waitZombie(t, pid)
	d, err := WaitGone(ctx, pid, 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "zombie") || !strings.Contains(err.Error(), "must wait for its child") || d < 50*time.Millisecond {
		t.Errorf("WaitGone(unreaped zombie) = %v, %v", d, err)
	}
	err = CheckPIDFree(ctx, pid, 20*time.Millisecond)
	if !errors.As(err, &pe) || !pe.Zombie {
		t.Errorf("CheckPIDFree(unreaped zombie) = %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := WaitGone(cctx, pid, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitGone(cancelled) = %v", err)
	}
}

func waitZombie(t *testing.T, pid int) {
	t.Helper()
	wait.For(t, 5*time.Second, fmt.Sprintf("process %d to become a zombie", pid), func() bool {
		st, err := readProcStat(pid)
		return err == nil && st.State == 'Z'
	})
}

func TestImages(t *testing.T) {
	// Captured from CRIU 4.2.1 dumping test/apps/criuhelper (one process, five
	// threads) and restoring it.
	tasks, err := ImageTasks("testdata/images")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 1 || tasks[0].PID != 24363 || tasks[0].SID != 24363 || tasks[0].PGID != 24363 ||
		len(tasks[0].Threads) != 5 || tasks[0].Threads[0] != 24363 || tasks[0].Threads[4] != 24368 {
		t.Errorf("tasks = %+v", tasks)
	}
	ds, err := ReadDumpStats("testdata/images")
	if err != nil {
		t.Fatal(err)
	}
	if ds.PagesScanned != 296 || ds.PagesWritten != 212 || ds.FrozenTime != 14374*time.Microsecond || ds.FreezingTime != 494*time.Microsecond || ds.PagePipes != 6 {
		t.Errorf("dump stats = %+v", ds)
	}
	rs, err := ReadRestoreStats("testdata/images")
	if err != nil {
		t.Fatal(err)
	}
	if rs.PagesRestored != 235 || rs.RestoreTime != 8072*time.Microsecond {
		t.Errorf("restore stats = %+v", rs)
	}
	if _, err := ImageTasks(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a CRIU image directory") {
		t.Errorf("ImageTasks(empty dir) = %v", err)
	}
	if _, err := readImage("testdata/images/stats-dump", imgCommonMagic, pstreeMagic); err == nil {
		t.Error("wrong magic accepted")
	}
}

// TestPreflightSelf runs Preflight on the test process itself (no CRIU, and
// pidfd_getfd on oneself needs no privilege).
func TestPreflightSelf(t *testing.T) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer (<-accepted).Close()

	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])

	mptcp := mptcpEnabled()
	var mln net.Listener
	if mptcp {
		var mlc net.ListenConfig
		mlc.SetMultipathTCP(true)
		if mln, err = mlc.Listen(context.Background(), "tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		defer mln.Close()
	}

	problems, err := Preflight(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var tcp, mp int
	for _, p := range problems {
		switch p.Cause {
		case CauseTCPEstablished:
			if strings.Contains(p.Desc, "established") && strings.Contains(p.Desc, ln.Addr().String()) {
				tcp++
			}
		case CauseMPTCP:
			if mln != nil && strings.Contains(p.Desc, mln.Addr().String()) && strings.Contains(p.Desc, "listening") {
				mp++
			}
		case CauseExternalUnix:
			t.Errorf("socketpair within the process reported: %v", p)
		}
		if p.PID != os.Getpid() || p.FD < 0 || p.Hint() == "" || !strings.HasPrefix(p.String(), "pid ") {
			t.Errorf("bad problem %+v", p)
		}
	}
	if tcp != 2 { // both ends of the connection live in this process
		t.Errorf("want 2 established TCP problems, got %v", problems)
	}
	if mptcp && mp != 1 {
		t.Errorf("want 1 MPTCP problem, got %v", problems)
	}
	if _, err := Preflight(freePID(t)); err == nil {
		t.Error("Preflight(free PID) did not fail")
	}
}

func mptcpEnabled() bool {
	b, err := os.ReadFile("/proc/sys/net/mptcp/enabled")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

func TestDumpRestoreErrorsWithoutCRIU(t *testing.T) {
	ctx := context.Background()
	_, err := Dump(ctx, "/bin/false", DumpOptions{PID: freePID(t), ImagesDir: t.TempDir()})
	var ce *Error
	if !errors.As(err, &ce) || ce.Cause != CauseNoProcess || !strings.Contains(err.Error(), "no process with PID") {
		t.Errorf("Dump(free PID) = %v", err)
	}
	// A "criu" that dies at once.
	_, err = Dump(ctx, "/bin/false", DumpOptions{PID: os.Getpid(), ImagesDir: t.TempDir()})
	if !errors.As(err, &ce) || ce.Op != "dump" || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("Dump with a dying criu = %v", err)
	}
	if _, err := Dump(ctx, "/nonexistent/criu", DumpOptions{PID: os.Getpid(), ImagesDir: t.TempDir()}); err == nil {
		t.Error("Dump with a missing criu succeeded")
	}
	for _, opts := range []DumpOptions{{PID: 0, ImagesDir: "x"}, {PID: os.Getpid()}, {PID: os.Getpid(), ImagesDir: t.TempDir(), LogFile: "a/b.log"}} {
		if _, err := Dump(ctx, "/bin/false", opts); err == nil {
			t.Errorf("Dump(%+v) succeeded", opts)
		}
	}
	_, err = Restore(ctx, "/bin/false", RestoreOptions{ImagesDir: t.TempDir()})
	if !errors.As(err, &ce) || ce.Op != "restore" {
		t.Errorf("Restore with a dying criu = %v", err)
	}
	for _, opts := range []RestoreOptions{{}, {ImagesDir: "/nonexistent"}, {ImagesDir: t.TempDir(), WorkDir: "/nonexistent"}} {
		if _, err := Restore(ctx, "/bin/false", opts); err == nil {
			t.Errorf("Restore(%+v) succeeded", opts)
		}
	}
}

// TestRespErrorDiskFull: a CRIU that reports a full disk only over RPC (its
// log could not be written) still gives CauseDiskFull, by errno or message.
func TestRespErrorDiskFull(t *testing.T) {
	fail := false
	for _, tc := range []struct {
		resp *rpc.CriuResp
		want Cause
	}{
		{&rpc.CriuResp{Success: &fail, CrErrno: ptr(int32(syscall.ENOSPC))}, CauseDiskFull},
		{&rpc.CriuResp{Success: &fail, CrErrno: ptr(int32(syscall.EDQUOT))}, CauseDiskFull},
		{&rpc.CriuResp{Success: &fail, CrErrmsg: ptr("Can't write pages: No space left on device")}, CauseDiskFull},
		{&rpc.CriuResp{Success: &fail, CrErrno: ptr(int32(syscall.EIO))}, CauseUnknown},
	} {
		err := respError(context.Background(), "restore", tc.resp, nil, "", nil, filepath.Join(t.TempDir(), "none.log"))
		var e *Error
		if !errors.As(err, &e) || e.Cause != tc.want || errors.Is(err, CauseDiskFull) != (tc.want == CauseDiskFull) {
			t.Errorf("errno %d, %q: %v, want cause %q", tc.resp.GetCrErrno(), tc.resp.GetCrErrmsg(), err, tc.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// "Run as root" is advice for a user who is not root; as root the hint
// names what else refuses CRIU.
func TestPermissionHintAsRoot(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	geteuid = func() int { return 1000 }
	if h := CausePermission.Hint(); !strings.HasPrefix(h, "run as root") {
		t.Errorf("hint as uid 1000: %q, want it to say run as root", h)
	}
	geteuid = func() int { return 0 }
	if h := CausePermission.Hint(); strings.Contains(h, "run as root") || !strings.Contains(h, "seccomp") {
		t.Errorf("hint as root: %q, want no \"run as root\" and the other refusers named", h)
	}
}
