package criu

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/testkit/wait"
)

// usernsHost is the first host uid (and gid) of the user namespace
// TestE2EUserNamespace runs in: its root, as a pod with hostUsers: false
// has it.
const usernsHost = 100000

func TestInitialUIDMap(t *testing.T) {
	for in, want := range map[string]bool{
		"         0          0 4294967295\n": true,
		"         0     100000      65536\n": false,
		"         0          0      65536\n": false,
		"":                                   false,
	} {
		if got := initialUIDMap([]byte(in)); got != want {
			t.Errorf("initialUIDMap(%q) = %v, want %v", in, got, want)
		}
	}
}

// Dump and Restore work as root of a user namespace that maps it to
// another uid (with mount and network namespaces of its own, as a pod with
// hostUsers: false): a service listening on a socket, in a PID namespace
// of its own, is dumped and restored, and answers. (Without CRIU's
// unprivileged mode every such restore failed: forcing the socket's
// buffer sizes, SO_SNDBUFFORCE, takes CAP_NET_ADMIN in the initial user
// namespace.)
func TestE2EUserNamespace(t *testing.T) {
	if dir := os.Getenv("KCR_TEST_USERNS_DIR"); dir != "" {
		inUserNS(t, dir, os.Getenv("KCR_TEST_USERNS_HELPER"))
		return
	}
	needCRIU(t)
	bin := helper(t)
	// The namespace's root is not the host's: it reaches only what others
	// may, and what it owns.
	shared, err := os.MkdirTemp("", "kcr-userns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	for _, d := range []string{shared, filepath.Dir(bin)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	test := filepath.Join(shared, "criu.test")
	copyFile(t, self, test)
	work := filepath.Join(shared, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(work, usernsHost, usernsHost); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(test, "-test.run=^TestE2EUserNamespace$", "-test.v")
	cmd.Env = append(os.Environ(), "KCR_TEST_USERNS_DIR="+work, "KCR_TEST_USERNS_HELPER="+bin, "TMPDIR="+work)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: usernsHost, Size: 65536}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: usernsHost, Size: 65536}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the test in a user namespace: %v\n%s", err, out)
	}
	t.Logf("in a user namespace:\n%s", out)
}

// inUserNS is TestE2EUserNamespace's part in the user namespace; dir is
// its work directory, bin the helper.
func inUserNS(t *testing.T, dir, bin string) {
	criu := needCRIU(t)
	if !inChildUserNS() {
		t.Fatal("not in a user namespace of its own")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	loUp(t)
	closeInherited(t)
	tg := &target{dir: dir, out: filepath.Join(dir, "out.log")}
	out, err := os.OpenFile(tg.out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	portFile := filepath.Join(dir, "port")
	cmd := exec.Command(bin, "-listen", "127.0.0.1:0", "-portfile", portFile)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = []string{"GODEBUG=multipathtcp=0"}
	// CRIU's parasite mounts a proc of the PID namespace in a directory
	// it makes in the task's working directory.
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tg.pid = cmd.Process.Pid
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer syscall.Kill(tg.pid, syscall.SIGKILL)
	tg.waitTicks(t, 0)
	b, err := os.ReadFile(portFile)
	if err != nil {
		t.Fatal(err)
	}
	tg.addr = string(b)
	tg.ping(t)
	img, work := filepath.Join(dir, "img"), filepath.Join(dir, "restore")
	for _, d := range []string{img, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if _, err := Dump(ctx, criu, DumpOptions{PID: tg.pid, ImagesDir: img}); err != nil {
		t.Fatal(err)
	}
	<-exited
	rr, err := Restore(ctx, criu, RestoreOptions{ImagesDir: img, WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(rr.PID, syscall.SIGKILL)
	if !wait.Until(10*time.Second, func() bool { return rr.PID > 0 }) {
		t.Fatal("no PID")
	}
	tg.pid = rr.PID
	tg.waitTicks(t, tg.lastTick(t))
	tg.ping(t)
	t.Logf("restored as PID %d in a user namespace mapped to %d", rr.PID, usernsHost)
}

// loUp brings the network namespace's loopback up.
func loUp(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		t.Fatalf("loopback up: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// closeInherited marks every descriptor above 2 close-on-exec: one this
// test inherited (from its runner) would otherwise reach the helper, and
// CRIU cannot dump a file of a mount outside the namespace.
func closeInherited(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}
