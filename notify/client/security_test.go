package client

// Root-kcr against another user's process: each test runs a victim (a
// notify server as one uid) and an attacker (another uid) that makes its
// own socket point at the victim's, and checks that kcr never reaches the
// victim through the attacker's PID.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/notify"
)

const (
	victimUID   = 61002
	attackerUID = 61001
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("KCR_CLIENT_HELPER"); mode != "" {
		if err := helper(mode); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper runs as another user; it prints "ready" once its socket is up and
// runs until killed.
func helper(mode string) error {
	if mode == "peer-client" {
		return peerClient()
	}
	path := os.Getenv("KCR_HELPER_PATH")
	switch mode {
	case "victim":
		g := notify.NewRegistry()
		mark := os.Getenv("KCR_HELPER_MARK")
		g.Register("victim", notify.Func(func(context.Context) error {
			return os.WriteFile(mark, []byte("before-checkpoint hook ran\n"), 0o600)
		}, nil))
		s, err := g.Start(notify.WithSocketPath(path), notify.WithLogger(slog.New(slog.DiscardHandler)),
			notify.WithMaxSuspend(20*time.Second))
		if err != nil {
			return err
		}
		defer s.Close()
	case "symlink":
		// Bind in its own directory, then swap a symlink to the victim's
		// socket in at the bound path.
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return err
		}
		l.SetUnlinkOnClose(false)
		defer l.Close()
		tmp := path + ".new"
		if err := os.Symlink(os.Getenv("KCR_HELPER_TARGET"), tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	case "newline":
		// A bound path holding a newline and a forged table line that
		// gives this socket's inode the victim's path.
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		name := path + "\n0: 2 0 10000 1 1 " + strconv.FormatUint(st.Ino, 10) + " " + os.Getenv("KCR_HELPER_TARGET")
		// The forged path's slashes are directories under the real one.
		if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
			return fmt.Errorf("bind %q: %w", name, err)
		}
		if err := unix.Listen(fd, 8); err != nil {
			return err
		}
	case "mountns":
		// Started as root in a mount namespace of its own: hide the
		// victim's directory under a tmpfs, become the attacker, and bind
		// the victim's path, padded so that /proc/<pid>/root plus it no
		// longer fits sun_path.
		dir := os.Getenv("KCR_HELPER_DIR")
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0700,uid="+strconv.Itoa(attackerUID)); err != nil {
			return fmt.Errorf("mount tmpfs: %w", err)
		}
		if err := syscall.Setresgid(attackerUID, attackerUID, attackerUID); err != nil {
			return err
		}
		if err := syscall.Setresuid(attackerUID, attackerUID, attackerUID); err != nil {
			return err
		}
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return fmt.Errorf("listen %q: %w", path, err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	fmt.Println("ready")
	select {}
}

// secEnv is a directory tree for a victim and an attacker, and a copy of
// the test binary that both may run.
type secEnv struct {
	t        *testing.T
	base     string // 0711, root's
	bin      string
	victim   string // victim's directory, 0700
	attacker string // attacker's directory, 0700
}

func newSecEnv(t *testing.T) *secEnv {
	t.Helper()
	imagetest.NeedRootTo(t, "run processes as other users")
	// Short paths: sun_path holds 108 bytes.
	base, err := os.MkdirTemp("/tmp", "ks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o711)
	e := &secEnv{t: t, base: base, victim: filepath.Join(base, "v"), attacker: filepath.Join(base, "a")}
	for dir, uid := range map[string]int{e.victim: victimUID, e.attacker: attackerUID} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	e.bin = filepath.Join(base, "helper")
	if err := os.WriteFile(e.bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs the test binary as helper mode and waits for "ready".
func (e *secEnv) start(mode string, uid int, env []string, attr *syscall.SysProcAttr) *exec.Cmd {
	e.t.Helper()
	cmd := exec.Command(e.bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, "KCR_CLIENT_HELPER="+mode)...)
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	if uid != 0 {
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
	}
	cmd.SysProcAttr = attr
	cmd.Dir = "/"
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("helper said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			e.t.Fatalf("%s helper: %v", mode, err)
		}
	case <-time.After(10 * time.Second):
		e.t.Fatalf("%s helper not ready", mode)
	}
	return cmd
}

// startVictim runs a notify server as the victim; its before-checkpoint
// hook writes the returned marker file.
func (e *secEnv) startVictim() (sock, mark string) {
	sock = filepath.Join(e.victim, "kcr-v.sock")
	mark = filepath.Join(e.victim, "hook-ran")
	e.start("victim", victimUID, []string{"KCR_HELPER_PATH=" + sock, "KCR_HELPER_MARK=" + mark}, nil)
	return sock, mark
}

// attack checkpoints the attacker's PID as root-kcr does and checks that
// the victim's hooks did not run.
func (e *secEnv) attack(pid int, mark string) error {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := Find(pid)
	if err == nil {
		_, err = s.Checkpoint(ctx, CheckpointRequest{HookBudget: time.Second, ResumeAfter: 2 * time.Second})
	}
	if _, serr := os.Stat(mark); serr == nil {
		e.t.Fatalf("root-kcr ran the victim's hooks through PID %d (err %v)", pid, err)
	}
	if err == nil {
		e.t.Fatalf("checkpoint through PID %d succeeded", pid)
	}
	return err
}

func TestSecuritySymlinkSwappedAfterBind(t *testing.T) {
	e := newSecEnv(t)
	victim, mark := e.startVictim()
	att := e.start("symlink", attackerUID, []string{"KCR_HELPER_PATH=" + filepath.Join(e.attacker, "kcr-a.sock"), "KCR_HELPER_TARGET=" + victim}, nil)
	err := e.attack(att.Process.Pid, mark)
	if !errors.Is(err, ErrUnsafeSocket) || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("want a refused symlink, got %v", err)
	}
}

func TestSecurityNewlineForgesSocketTable(t *testing.T) {
	e := newSecEnv(t)
	victim, mark := e.startVictim()
	att := e.start("newline", attackerUID, []string{"KCR_HELPER_PATH=" + filepath.Join(e.attacker, "x"), "KCR_HELPER_TARGET=" + victim}, nil)
	err := e.attack(att.Process.Pid, mark)
	if !errors.Is(err, ErrUnsafeSocket) {
		t.Fatalf("want the forged table refused, got %v", err)
	}
}

func TestSecurityLongPathInOwnMountNamespace(t *testing.T) {
	e := newSecEnv(t)
	victim, mark := e.startVictim()
	// The victim's path, padded with "./" to push /proc/<pid>/root/... past
	// sun_path while the path itself still fits.
	pad := strings.Repeat("./", (107-len(victim))/2)
	long := filepath.Dir(victim) + "/" + pad + filepath.Base(victim)
	if len(long) >= 108 {
		t.Fatalf("padded path too long: %d", len(long))
	}
	att := e.start("mountns", 0, []string{"KCR_HELPER_PATH=" + long, "KCR_HELPER_DIR=" + e.victim},
		&syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS})
	e.attack(att.Process.Pid, mark)
}

// TestSecurityPeerOfAnotherUser: a listener in the target's own tree but of
// a third uid is refused too.
func TestSecurityPeerCheck(t *testing.T) {
	e := newSecEnv(t)
	victim, _ := e.startVictim()
	// Find says the victim's socket belongs to this (root) test process:
	// the victim is not in this process's tree... but it is our child. Its
	// uid is neither ours nor root.
	s := &Socket{PID: os.Getpid(), Path: victim}
	_, err := s.Hello(context.Background())
	if !errors.Is(err, ErrUnsafeSocket) {
		t.Fatalf("Hello to a child of another uid: %v, want ErrUnsafeSocket", err)
	}
}
