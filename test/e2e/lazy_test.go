package e2e

import (
	"bufio"
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
)

// askHeap sends a command to lazyheap and returns its answer line.
func askHeap(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("lazyheap %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(c, "%s\n", cmd)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("lazyheap %s %s: %v", addr, cmd, err)
	}
	return line
}

// kcr restore --lazy of a 256 MiB heap: the heap's content is intact.
func TestLazyRestoreHeap(t *testing.T) {
	need(t)
	dir := t.TempDir()
	bin := filepath.Join(binDir, "lazyheap")
	if out, err := exec.Command("go", "build", "-o", bin, "../../criu/testdata/lazyheap").CombinedOutput(); err != nil {
		t.Fatalf("build lazyheap: %v\n%s", err, out)
	}
	log, err := os.OpenFile(filepath.Join(dir, "heap.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	portFile := filepath.Join(dir, "port")
	cmd := exec.Command(bin, "-mb", "256", "-seed", "7", "-portfile", portFile)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "GODEBUG=multipathtcp=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log.Close()
	pid := cmd.Process.Pid
	go cmd.Wait()
	t.Cleanup(func() { killWait(pid) })
	var addr string
	for i := 0; i < 600 && addr == ""; i++ {
		if b, err := os.ReadFile(portFile); err == nil {
			addr = string(b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if addr == "" {
		t.Fatal("lazyheap did not start")
	}
	var sum0 string
	var pages, bad, ms int
	if _, err := fmt.Sscanf(askHeap(t, addr, "sum"), "sum %s pages %d bad %d ms %d", &sum0, &pages, &bad, &ms); err != nil || bad != 0 || pages != 256<<8 {
		t.Fatalf("before: sum %s pages %d bad %d (%v)", sum0, pages, bad, err)
	}

	img := filepath.Join(dir, "img")
	// lazyheap closes its end of our connection a moment after we do; until
	// then the socket is in CLOSE-WAIT, which kcr rightly refuses to dump.
	for i := 0; ; i++ {
		r := kcr(t, "checkpoint", "--no-hooks", "-o", img, strconv.Itoa(pid))
		if r.code == 0 {
			break
		}
		if i == 20 || !strings.Contains(r.stderr, "close-wait") {
			t.Fatalf("checkpoint: exit %d: %s", r.code, r.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rpid, _ := restore(t, img, "--lazy")
	if rpid != pid {
		t.Fatalf("restored as %d, want %d", rpid, pid)
	}
	var sum1 string
	if _, err := fmt.Sscanf(askHeap(t, addr, "sum"), "sum %s pages %d bad %d ms %d", &sum1, &pages, &bad, &ms); err != nil {
		t.Fatal(err)
	}
	if sum1 != sum0 || bad != 0 {
		t.Fatalf("after a lazy restore: sum %s (was %s), %d bad pages", sum1, sum0, bad)
	}
	t.Logf("256 MiB heap intact after lazy restore (full pass %d ms inside the process)", ms)
}
