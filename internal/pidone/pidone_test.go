package pidone

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const roleEnv = "KCR_PIDONE_TEST_ROLE"

// orphans is how many orphans the program leaves behind.
const orphans = 20

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "init": // PID 1 of its namespace, under Run
		os.Setenv(roleEnv, "program") // the first of two values is the one a program reads
		code, err := Run("/proc/self/exe", os.Args, os.Environ())
		if err != nil {
			fmt.Println("run:", err)
		}
		os.Exit(code)
	case "program":
		program()
	}
	os.Exit(m.Run())
}

// program leaves orphans, reports the zombies in its namespace once they
// exited, and exits 7 on SIGTERM.
func program() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	for range orphans {
		// sh exits at once (and is reaped here); its background
		// child is orphaned and exits a little later.
		exec.Command("sh", "-c", "(sleep 0.1; true) & exit 0").Run()
	}
	time.Sleep(2 * time.Second)
	fmt.Printf("zombies %d\n", zombiesIn(os.Getpid()))
	<-term
	os.Exit(7)
}

// zombiesIn counts the zombies of the PID namespace that self (a host PID
// of the reader's /proc: the test does not mount one) is in.
func zombiesIn(self int) int {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return -1
	}
	n := 0
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 || f[0] != "Z" {
			continue
		}
		// A zombie's own namespace link is gone: its parent's is not.
		ppid, _ := strconv.Atoi(f[1])
		if pns, err := os.Readlink("/proc/" + strconv.Itoa(ppid) + "/ns/pid"); err == nil && pns == ns {
			n++
		}
	}
	return n
}

// runAsPID1 runs this test binary as PID 1 of a new PID namespace in role,
// and returns the zombies it reported and its exit code after SIGTERM.
func runAsPID1(t *testing.T, role string) (zombies, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if _, serr := fmt.Sscanf(line, "zombies %d", &zombies); serr != nil {
		t.Fatalf("%s: %q %v", role, line, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no exit 30 s after SIGTERM", role)
	}
	return zombies, cmd.ProcessState.ExitCode()
}

// Under Run, PID 1 reaps every orphan of its namespace and the program
// gets the signals PID 1 is sent; run as PID 1 itself, a program that
// reaps only its own children leaves the orphans as zombies (the test's
// control).
func TestRunReapsAndForwards(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("run as root: the test makes a PID namespace")
	}
	if z, _ := runAsPID1(t, "program"); z < orphans {
		t.Fatalf("control: the program as PID 1 left %d zombies, want %d: the test cannot see them", z, orphans)
	}
	z, code := runAsPID1(t, "init")
	if z != 0 {
		t.Errorf("under Run: %d zombies in the namespace, want 0", z)
	}
	if code != 7 {
		t.Errorf("under Run: exit code %d after SIGTERM, want the program's 7", code)
	}
}
