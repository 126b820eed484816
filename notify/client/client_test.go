package client

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/notify/proto"
)

// unixSample is /proc/net/unix as Linux 6.x printed it for: a listening
// socket in a directory whose name has two spaces, a connection to it
// (connected client end, unbound, and the accepted end, which shows the
// listener's path), a listening socket whose path ends in a space, an
// abstract listening socket, and two unbound sockets.
const unixSample = `Num       RefCount Protocol Flags    Type St Inode Path
000000001d6ff5b8: 00000002 00000000 00000000 0001 03 38086
0000000073726bbf: 00000003 00000000 00000000 0001 03  1159
000000004b4f605d: 00000002 00000000 00010000 0001 01 41839 /tmp/kcr-trailing .sock 
000000005b82627e: 00000002 00000000 00010000 0001 01 41836 /tmp/kcr sample  dir/kcr-1234.sock
00000000e0ecf853: 00000003 00000000 00000000 0001 03 41838 /tmp/kcr sample  dir/kcr-1234.sock
00000000b47b8fc0: 00000003 00000000 00000000 0001 03 41837
00000000d2a0fa03: 00000003 00000000 00000000 0001 03  1160
00000000bc1c1466: 00000002 00000000 00010000 0001 01 41840 @kcr-abstract.sock
0000000012345678: 00000002 00000000 00010000 0005 01   777 /run/kcr/kcr-1.sock
garbage line
0000000012345679: 00000002 00000000 0001zzzz 0001 01 41841 /run/kcr/kcr-2.sock
`

func TestParseUnixTable(t *testing.T) {
	all := map[string]bool{}
	for _, ino := range []string{"38086", "1159", "41839", "41836", "41838", "41837", "1160", "41840", "777", "41841"} {
		all[ino] = true
	}
	for _, tc := range []struct {
		name string
		want map[string]bool
		out  []string
	}{
		{"all", all, []string{"/tmp/kcr-trailing .sock ", "/tmp/kcr sample  dir/kcr-1234.sock", "/run/kcr/kcr-1.sock"}},
		{"listener with spaces", map[string]bool{"41836": true}, []string{"/tmp/kcr sample  dir/kcr-1234.sock"}},
		{"accepted end is not listening", map[string]bool{"41838": true}, nil},
		{"connected client", map[string]bool{"41837": true}, nil},
		{"abstract skipped", map[string]bool{"41840": true}, nil},
		{"padded inode", map[string]bool{"777": true}, []string{"/run/kcr/kcr-1.sock"}},
		{"bad flags", map[string]bool{"41841": true}, nil},
		{"not ours", map[string]bool{"99": true}, nil},
		{"none wanted", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUnixTable(strings.NewReader(unixSample), tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.out) {
				t.Fatalf("got %q, want %q", got, tc.out)
			}
		})
	}
	// The header alone, and nothing.
	for _, in := range []string{"Num       RefCount Protocol Flags    Type St Inode Path\n", ""} {
		if got, err := parseUnixTable(strings.NewReader(in), all); err != nil || len(got) != 0 {
			t.Errorf("%q: %q, %v", in, got, err)
		}
	}
}

// TestParseLiveUnixTable binds a socket with awkward spaces and finds it in
// the kernel's own table.
func TestParseLiveUnixTable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a  b ")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kcr-x y.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var ino string
	raw, _ := l.SyscallConn()
	raw.Control(func(fd uintptr) {
		fi, err := os.Stat("/proc/self/fd/" + strconv.Itoa(int(fd)))
		if err == nil {
			ino = strconv.FormatUint(statIno(fi), 10)
		}
	})
	if ino == "" {
		t.Skip("no inode")
	}
	got, err := listeningUnix("/proc/self/net/unix", map[string]bool{ino: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{path}) {
		t.Fatalf("got %q, want %q", got, path)
	}
}

func startServer(t *testing.T, g *notify.Registry) *notify.Server {
	t.Helper()
	s, err := g.Start(notify.WithSocketPath(filepath.Join(t.TempDir(), "kcr-c.sock")),
		notify.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestFindSelf(t *testing.T) {
	s := startServer(t, notify.NewRegistry())
	p, err := Find(os.Getpid())
	if err != nil {
		t.Fatalf("Find(self): %v", err)
	}
	if p.PID != os.Getpid() || p.Path != s.Path() {
		t.Fatalf("Find = %+v, server at %q", p, s.Path())
	}
	m, err := p.Hello(context.Background())
	if err != nil || m.PID != os.Getpid() {
		t.Fatalf("Hello through the found path: %+v, %v", m, err)
	}
}

func TestFindNoProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Skip(err)
	}
	pidMax, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for _, pid := range []int{0, -1, pidMax + 1} {
		if _, err := Find(pid); !errors.Is(err, proto.ErrNoProcess) {
			t.Errorf("Find(%d) = %v, want ErrNoProcess", pid, err)
		}
	}
}

func TestFindNoSocket(t *testing.T) {
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	_, err := Find(cmd.Process.Pid)
	if !errors.Is(err, ErrNoSocket) {
		t.Fatalf("Find(sleep) = %v, want ErrNoSocket", err)
	}
	if !strings.Contains(err.Error(), "--no-hooks") || !strings.Contains(err.Error(), "sleep") {
		t.Errorf("message %q should name the process and mention --no-hooks", err)
	}
}

func TestCheckpointZeroBudgetWaitsForAppDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 5.5 s")
	}
	g := notify.NewRegistry()
	// Longer than the 5 s the client used to wait when no budget was
	// given, within the app's default budget.
	g.Register("slowish", notify.Func(func(ctx context.Context) error {
		time.Sleep(5500 * time.Millisecond)
		return nil
	}, nil))
	s := startServer(t, g)
	m, err := Checkpoint(context.Background(), s.Path(), CheckpointRequest{ResumeAfter: 10 * time.Second})
	if err != nil || m.Type != proto.TypeReady {
		t.Fatalf("Checkpoint with no budget: %+v, %v", m, err)
	}
	if _, err := Resume(context.Background(), s.Path(), "", 0); err != nil {
		t.Fatalf("Resume with wait 0: %v", err)
	}
}

func TestResumeCancelledIsNotPending(t *testing.T) {
	s := checkpointedWithSlowAfter(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := Resume(ctx, s.Path(), "", 5*time.Second)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrPending) {
		t.Fatalf("cancelled Resume: %v, want context.Canceled", err)
	}
}

func TestResumePending(t *testing.T) {
	s := checkpointedWithSlowAfter(t)
	_, err := Resume(context.Background(), s.Path(), "", 200*time.Millisecond)
	if !errors.Is(err, ErrPending) {
		t.Fatalf("Resume with a short wait: %v, want ErrPending", err)
	}
}

func TestAfterHookFailureReported(t *testing.T) {
	g := notify.NewRegistry()
	g.Register("reopen", notify.Func(nil, func(ctx context.Context, ev notify.Event) error {
		return errors.New("cannot reconnect")
	}))
	s := startServer(t, g)
	if _, err := Checkpoint(context.Background(), s.Path(), CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	m, err := Restored(context.Background(), s.Path(), 2, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "cannot reconnect") || m.Type != proto.TypeDone || len(m.Reports) != 1 || m.Reports[0].Error == "" {
		t.Fatalf("Restored: %+v, %v", m, err)
	}
}

func TestConnectError(t *testing.T) {
	_, err := Hello(context.Background(), filepath.Join(t.TempDir(), "kcr-none.sock"))
	if err == nil || !strings.Contains(err.Error(), "connect to control socket") {
		t.Fatalf("Hello on a missing socket: %v", err)
	}
}

// TestParseUnixTableForged: a path with a newline forges a line; the
// wanted inode on two lines, or a control character, refuses the table.
func TestParseUnixTableForged(t *testing.T) {
	for _, table := range []string{
		"h\n0: 2 0 10000 1 1 7 /a/x\n0: 2 0 10000 1 1 7 /v/kcr-v.sock\n",
		"h\n0: 2 0 10000 1 1 7 /a/kcr-\x1b]0;x\x07.sock\n",
	} {
		if got, err := parseUnixTable(strings.NewReader(table), map[string]bool{"7": true}); !errors.Is(err, ErrUnsafeSocket) {
			t.Errorf("%q: %q, %v; want ErrUnsafeSocket", table, got, err)
		}
	}
}

// checkpointedWithSlowAfter starts a server whose after hook runs until the
// test ends, and checkpoints it: a Resume then waits for the hook.
func checkpointedWithSlowAfter(t *testing.T) *notify.Server {
	t.Helper()
	g := notify.NewRegistry()
	release := make(chan struct{})
	g.Register("slow-after", notify.Func(nil, func(ctx context.Context, ev notify.Event) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}))
	s := startServer(t, g)
	t.Cleanup(func() { close(release) }) // before Close, which waits for the hook
	if _, err := Checkpoint(context.Background(), s.Path(), CheckpointRequest{HookBudget: time.Second, ResumeAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	return s
}

// An app whose notify library predates a request refuses it as it refuses
// any type it does not know; the client's error wraps proto.ErrUnknownType
// then, and only then.
func TestRefusedUnknownType(t *testing.T) {
	for _, tc := range []struct {
		reply   string
		unknown bool
	}{
		// What proto.Decode of such an app says, sent back as its reply.
		{`malformed control message: unknown type "activity"`, true},
		{"unexpected message type info", false},
		{"malformed control message: negative duration", false},
	} {
		path := filepath.Join(t.TempDir(), "app.sock")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			var b [4096]byte
			c.Read(b[:]) // the request, whatever it is
			proto.Write(c, proto.Message{Type: proto.TypeError, Error: tc.reply})
		}()
		_, err = Activity(context.Background(), path)
		ln.Close()
		if err == nil || errors.Is(err, proto.ErrUnknownType) != tc.unknown || !strings.Contains(err.Error(), tc.reply) {
			t.Errorf("reply %q: Activity's error %v, want one that says it and wraps ErrUnknownType: %v", tc.reply, err, tc.unknown)
		}
	}
}
