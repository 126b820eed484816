package e2e

// kcr SIGKILLed while CRIU holds the app at each stage of its dump: CRIU
// does not die with kcr; it finds kcr gone at its next notification, cures
// its parasite and resumes the tree, and the app resumes. The test stops
// CRIU itself (it ptraces CRIU and halts it at a syscall of the stage), so
// that kcr dies at that stage and no other, then lets CRIU go on.

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// criuStage names a stage of CRIU's dump and the syscall entry (of CRIU)
// where it holds: nr, an optional first argument, and what its log (level
// 4) must already say.
type criuStage struct {
	name string
	nr   uint64
	arg0 []uint64 // any of these as the first argument; nil: any
	log  string
	// term sends kcr SIGTERM (an interrupted checkpoint) instead of SIGKILL.
	term bool
}

// amd64 syscall numbers and ptrace requests.
const (
	sysGetsockopt     = 55
	sysPtrace         = 101
	sysSplice         = 275
	ptraceCont        = 7
	ptraceGetSyscInfo = 0x420e
	ptraceSyscInfoEnt = 1
)

func TestKCRKilledAtCRIUStage(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Fatalf("the stage holds use amd64 syscall numbers; GOARCH is %s", runtime.GOARCH)
	}
	for _, st := range []criuStage{
		// The tree is seized (CRIU's next ptrace request after the seize).
		{name: "seized", nr: sysPtrace, log: "Seized task"},
		// Parasite injection: CRIU has set the app's registers to run a
		// syscall it wrote into the app's code (to create the parasite's
		// memfd) and lets it run. A CRIU killed here leaves the app to
		// run that code untraced: it dies of SIGTRAP at 0x400003.
		{name: "parasite", nr: sysPtrace, arg0: []uint64{ptraceCont}, log: "Parasite syscall_ip"},
		// The parasite serves the app's fds; CRIU reads a socket's options.
		{name: "sockets", nr: sysGetsockopt, log: " socket at "},
		// CRIU writes the app's pages, drained by the parasite.
		{name: "memory", nr: sysSplice, log: "Dumping pages"},
		// Every image written; CRIU waits for kcr's answer to post-dump.
		{name: "post-dump"},
		// kcr interrupted (SIGTERM) in the memory dump: it hangs up on
		// CRIU the same way, and exits once CRIU has let the tree go.
		{name: "memory-sigterm", nr: sysSplice, log: "Dumping pages", term: true},
	} {
		t.Run(st.name, func(t *testing.T) { killAtStage(t, st) })
	}
}

func killAtStage(t *testing.T, st criuStage) {
	need(t)
	a := startApp(t, "-heap-mb", "64")
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	env := []string{"KCR_TEST_STALL_AFTER_HOOKS=2s"}
	if st.name == "post-dump" {
		env = []string{"KCR_TEST_STALL_AT_POST_DUMP=60s"}
	}
	cmd := kcrOpts{env: env}.cmd("-v", "checkpoint", "-o", img, strconv.Itoa(a.pid))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cmd.Process.Kill(); <-exited }()
	a.waitEvent(20*time.Second, func(e event) bool { return e["ev"] == "before" && e.str("name") == "state" })
	criuPID := swrkChild(t, cmd.Process.Pid)
	logPath := func() string {
		m, _ := filepath.Glob(filepath.Join(dir, ".img.kcr-tmp-*", "criu", "dump.log"))
		if len(m) != 1 {
			t.Fatalf("CRIU's dump.log in %s: %v", dir, m)
		}
		return m[0]
	}
	kill := func() {
		if st.term {
			// kcr waits for CRIU, which is held until kill returns.
			cmd.Process.Signal(syscall.SIGTERM)
			return
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	var at string
	if st.name == "post-dump" {
		eventually(t, 30*time.Second, "CRIU at its post-dump stage", func() (bool, string) {
			b, _ := os.ReadFile(logPath())
			return strings.Contains(string(b), "Running post-dump scripts"), "not yet"
		})
		kill()
		at = "post-dump"
	} else {
		held, err := holdCRIU(criuPID, st, logPath(), kill)
		if err != nil {
			t.Fatalf("holding CRIU (PID %d) at stage %s: %v", criuPID, st.name, err)
		}
		at = held
	}
	killed := time.Now()
	t.Logf("kcr killed with CRIU at %s", at)
	if st.term {
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			t.Fatal("kcr did not exit after SIGTERM")
		}
		if cmd.ProcessState.Success() {
			t.Fatal("the interrupted kcr checkpoint exited 0")
		}
	}

	e := a.waitEvent(30*time.Second, func(e event) bool { return e["ev"] == "after" && e.str("name") == "state" })
	resumed := time.Since(killed)
	if e.str("kind") != "resume" {
		t.Fatalf("after kcr died at CRIU stage %s: %v, want a resume", st.name, e)
	}
	c0, _, _ := state(t, a.listen)
	eventually(t, 10*time.Second, "the app working again", func() (bool, string) {
		c1, _, _ := state(t, a.listen)
		return c1 > c0, fmt.Sprintf("counter %d", c1)
	})
	if !alive(a.pid) {
		t.Fatal("the app died")
	}
	// CRIU releases the threads one by one; some run before the leader.
	eventually(t, 10*time.Second, "the app released by CRIU", func() (bool, string) {
		tp := tracerPID(a.pid)
		return tp == 0, fmt.Sprintf("traced by PID %d", tp)
	})
	t.Logf("kcr killed at CRIU stage %s: the app resumed %v later", st.name, resumed.Round(time.Millisecond))
	if st.term {
		// kcr removed its unfinished image after CRIU let the tree go.
		left, _ := filepath.Glob(filepath.Join(dir, "*img*"))
		if hidden, _ := filepath.Glob(filepath.Join(dir, ".img*")); len(left)+len(hidden) != 0 {
			t.Fatalf("the interrupted kcr left %v %v", left, hidden)
		}
		return
	}
	if b, err := os.ReadFile(logPath()); err != nil || !strings.Contains(string(b), "Dumping FAILED") {
		t.Fatalf("CRIU's log does not end the dump as failed (err %v):\n%s", err, lastBytes(string(b), 600))
	}
	if _, err := os.Stat(img); err == nil {
		t.Fatal("an image was published although kcr died mid-dump")
	}
	// No stats-dump: kcr recover refuses the unfinished dump (exit 5).
	if r := runKCR(t, kcrOpts{log: logFailed}, "recover", dir); r.code == 0 {
		t.Fatalf("kcr recover accepted a dump that CRIU failed: %q", r.stderr)
	}
}

// swrkChild returns the PID of the "criu swrk" that kcr (PID parent) started.
func swrkChild(t *testing.T, parent int) int {
	t.Helper()
	var pid int
	eventually(t, 10*time.Second, "kcr's criu swrk", func() (bool, string) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			p, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) < 2 || f[1] != strconv.Itoa(parent) {
				continue
			}
			if cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); strings.Contains(string(cl), "swrk") {
				pid = p
				return true, ""
			}
		}
		return false, "none"
	})
	return pid
}

func tracerPID(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}

// holdCRIU ptraces CRIU (PID pid), stops it at the first entry of st's
// syscall once its log says st.log, calls kill there, and lets CRIU go on.
// It returns where CRIU was held (the log's last line). All ptrace calls
// run on one locked OS thread, as ptrace requires.
func holdCRIU(pid int, st criuStage, logPath string, kill func()) (string, error) {
	type result struct {
		at  string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		at, err := holdCRIULocked(pid, st, logPath, kill)
		ch <- result{at, err}
	}()
	r := <-ch
	return r.at, r.err
}

func holdCRIULocked(pid int, st criuStage, logPath string, kill func()) (string, error) {
	// PTRACE_SEIZE with its options: CRIU is not stopped yet.
	if _, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, unix.PTRACE_O_TRACESYSGOOD, 0, 0); errno != 0 {
		return "", fmt.Errorf("seize: %w", errno)
	}
	if err := unix.PtraceInterrupt(pid); err != nil {
		return "", fmt.Errorf("interrupt: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
			return "", fmt.Errorf("wait: %w", err)
		}
		if ws.Exited() || ws.Signaled() {
			return "", fmt.Errorf("CRIU ended (%v) before the stage", ws)
		}
		sig := 0
		switch {
		case ws.StopSignal() == syscall.SIGTRAP|0x80:
			if at, ok := atStage(pid, st, logPath); ok {
				kill()
				unix.PtraceDetach(pid)
				return at, nil
			}
		case ws.StopSignal() == syscall.SIGTRAP && ws.TrapCause() != 0:
			// PTRACE_EVENT_STOP (our interrupt, a group stop).
		default:
			sig = int(ws.StopSignal())
		}
		if err := unix.PtraceSyscall(pid, sig); err != nil {
			return "", fmt.Errorf("resume: %w", err)
		}
	}
	unix.PtraceDetach(pid)
	return "", fmt.Errorf("CRIU did not reach the stage within a minute")
}

// atStage reports whether CRIU (in a syscall stop) is entering st's
// syscall with its log past st.log, and the log's last line.
func atStage(pid int, st criuStage, logPath string) (string, bool) {
	// struct ptrace_syscall_info: op u8, pad, arch u32, ip, sp, then for
	// an entry nr and args[6] (u64 each).
	var info [88]byte
	_, _, errno := unix.Syscall6(unix.SYS_PTRACE, ptraceGetSyscInfo, uintptr(pid), uintptr(len(info)), uintptr(unsafe.Pointer(&info[0])), 0, 0)
	if errno != 0 || info[0] != ptraceSyscInfoEnt {
		return "", false
	}
	nr := *(*uint64)(unsafe.Pointer(&info[24]))
	arg0 := *(*uint64)(unsafe.Pointer(&info[32]))
	if nr != st.nr {
		return "", false
	}
	if st.arg0 != nil && !slices.Contains(st.arg0, arg0) {
		return "", false
	}
	b, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(b), st.log) {
		return "", false
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return fmt.Sprintf("syscall %d(%#x), log: %s", nr, arg0, lines[len(lines)-1]), true
}
