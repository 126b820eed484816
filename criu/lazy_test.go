package criu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }

// fakeCRIU writes a shell script standing in for "criu lazy-pages". The
// script sees the real arguments: $CMD is the command ("lazy-pages"), $W
// the --work-dir, $L the --log-file.
func fakeCRIU(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "criu")
	script := `#!/bin/sh
CMD=$1 W= L=
while [ $# -gt 0 ]; do
	case "$1" in
	--work-dir) W=$2; shift;;
	--log-file) L=$2; shift;;
	esac
	shift
done
` + body
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func lazyDirs(t *testing.T) (images, work string) {
	t.Helper()
	return t.TempDir(), t.TempDir()
}

func TestStartLazyPagesDaemonFails(t *testing.T) {
	img, work := lazyDirs(t)
	criu := fakeCRIU(t, `echo "(00.000100) Error (criu/uffd.c:1): uffd: no pagemap for 42" > "$W/$L"
echo "something on stderr" >&2
exit 1
`)
	_, err := StartLazyPages(context.Background(), criu, LazyPagesOptions{ImagesDir: img, WorkDir: work})
	var ce *Error
	if !errors.As(err, &ce) || ce.Op != "lazy-pages" || ce.Log != filepath.Join(work, DefaultLazyPagesLog) {
		t.Fatalf("StartLazyPages with a dying daemon = %#v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "no pagemap for 42") || !strings.Contains(msg, "exited") || strings.Contains(msg, "\n") {
		t.Errorf("error %q", msg)
	}
	t.Logf("%v", err)

	// Nothing in the log: what it printed, and the exit status.
	criu = fakeCRIU(t, `echo "Error: unknown option --status-fd" >&2; exit 2`)
	_, err = StartLazyPages(context.Background(), criu, LazyPagesOptions{ImagesDir: img, WorkDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "unknown option --status-fd") || !strings.Contains(err.Error(), "(not written)") {
		t.Errorf("StartLazyPages, no log = %v", err)
	}
	t.Logf("%v", err)
}

// pidFile makes the fake daemon record its PID, so that the test can check
// it is gone.
const pidFile = `echo $$ > "$W/pid"
`

func fakePID(t *testing.T, work string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(work, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestStartLazyPagesNotReady(t *testing.T) {
	img, work := lazyDirs(t)
	criu := fakeCRIU(t, pidFile+`exec sleep 60`)
	start := time.Now()
	_, err := StartLazyPages(context.Background(), criu, LazyPagesOptions{ImagesDir: img, WorkDir: work, ReadyTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "was not ready after 200ms") || !strings.Contains(err.Error(), "(log: ") {
		t.Fatalf("StartLazyPages with a silent daemon = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	t.Logf("%v", err)
	if _, err := os.Stat("/proc/" + strconv.Itoa(fakePID(t, work))); err == nil {
		t.Error("the daemon was left running")
	}

	// Ready, but no socket.
	work = t.TempDir()
	criu = fakeCRIU(t, pidFile+`printf '\0' >&3; exec 3>&-; exec sleep 60`)
	_, err = StartLazyPages(context.Background(), criu, LazyPagesOptions{ImagesDir: img, WorkDir: work})
	if err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("StartLazyPages without a socket = %v", err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(fakePID(t, work))); err == nil {
		t.Error("the daemon was left running")
	}

	// Cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	criu = fakeCRIU(t, `exec sleep 60`)
	_, err = StartLazyPages(ctx, criu, LazyPagesOptions{ImagesDir: img, WorkDir: t.TempDir()})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled StartLazyPages = %v", err)
	}
}

// listenLazySocket creates the socket the fake daemon does not create.
func listenLazySocket(t *testing.T, work string) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(work, LazyPagesSocket))
	if err != nil {
		t.Skipf("unix socket: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
}

func TestStartLazyPagesReadyAndWait(t *testing.T) {
	img, work := lazyDirs(t)
	listenLazySocket(t, work)
	criu := fakeCRIU(t, `ls -l /proc/$$/fd/ > "$W/fds"
printf '\0' >&3; exec 3>&-
read line < "$W/go"
echo "(00.500000) uffd: 77-12: UFFD transferred pages: (10/10)" >> "$W/$L"
exit 0
`)
	if err := mkfifo(filepath.Join(work, "go")); err != nil {
		t.Skip(err)
	}
	d, err := StartLazyPages(context.Background(), criu, LazyPagesOptions{ImagesDir: img, WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	if d.LogPath != filepath.Join(work, DefaultLazyPagesLog) || d.SocketPath != filepath.Join(work, LazyPagesSocket) || d.PID <= 0 {
		t.Errorf("daemon %+v", d)
	}
	// Own session, stdin /dev/null, nothing of ours but the status pipe.
	st, err := readProcStat(d.PID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Session != d.PID || st.Pgrp != d.PID {
		t.Errorf("daemon session %d, group %d; want its own (%d)", st.Session, st.Pgrp, d.PID)
	}
	fds, _ := os.ReadFile(filepath.Join(work, "fds"))
	if !strings.Contains(string(fds), " 0 -> /dev/null") || !strings.Contains(string(fds), "memfd:criu-lazy-pages-output") ||
		strings.Contains(string(fds), "socket:") || strings.Contains(string(fds), "swrk") {
		t.Errorf("daemon fds:\n%s", fds)
	}
	select {
	case <-d.Done():
		t.Fatal("done too early")
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := d.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait = %v", err)
	}
	if err := os.WriteFile(filepath.Join(work, "go"), []byte("go\n"), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(context.Background()); err != nil {
		t.Errorf("Wait = %v", err)
	}
	st2, err := ReadLazyPagesStats(d.LogPath)
	if err != nil || *st2 != (LazyPagesStats{Tasks: 1, Copied: 10, Total: 10}) {
		t.Errorf("ReadLazyPagesStats = %+v, %v", st2, err)
	}
}

func TestLazyPagesWaitError(t *testing.T) {
	img, work := lazyDirs(t)
	listenLazySocket(t, work)
	criu := fakeCRIU(t, `printf '\0' >&3; exec 3>&-
echo "(01.000000) Error (criu/uffd.c:2): uffd: 77-12: Can't read uffd message" >> "$W/$L"
exit 1
`)
	d, err := StartLazyPages(context.Background(), criu, LazyPagesOptions{ImagesDir: img, WorkDir: work, LogFile: "lp.log"})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Wait(context.Background())
	var ce *Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "Can't read uffd message") || ce.Log != filepath.Join(work, "lp.log") {
		t.Errorf("Wait = %v", err)
	}
	t.Logf("%v", err)
	d.Kill() // harmless once it is gone
}

func TestLazyPagesBadOptions(t *testing.T) {
	for _, opts := range []LazyPagesOptions{{}, {ImagesDir: "/nonexistent"}, {ImagesDir: t.TempDir(), WorkDir: "/nonexistent"},
		{ImagesDir: t.TempDir(), LogFile: "a/b.log"}, {ImagesDir: "/etc/hostname"}} {
		if _, err := StartLazyPages(context.Background(), "/bin/false", opts); err == nil {
			t.Errorf("StartLazyPages(%+v) succeeded", opts)
		}
	}
	if _, err := StartLazyPages(context.Background(), "/nonexistent/criu", LazyPagesOptions{ImagesDir: t.TempDir()}); err == nil {
		t.Error("StartLazyPages with a missing criu succeeded")
	}
}

// A lazy Restore whose daemon cannot start fails with the daemon's error,
// before starting criu swrk.
func TestRestoreLazyDaemonFails(t *testing.T) {
	img, work := lazyDirs(t)
	criu := fakeCRIU(t, `if [ "$CMD" != lazy-pages ]; then echo "swrk started" >&2; exit 1; fi
echo "(00.000100) Error (criu/protobuf.c:72): Unexpected EOF on (empty-image)" > "$W/$L"
exit 1
`)
	_, err := Restore(context.Background(), criu, RestoreOptions{ImagesDir: img, WorkDir: work, LazyPages: true})
	var ce *Error
	if !errors.As(err, &ce) || ce.Op != "lazy-pages" || !strings.Contains(err.Error(), "Unexpected EOF") {
		t.Errorf("Restore with a failing lazy-pages daemon = %v", err)
	}
	t.Logf("%v", err)
}

func TestReadLazyPagesStats(t *testing.T) {
	log := filepath.Join(t.TempDir(), "lazy-pages.log")
	content := `(00.043525) uffd: 28398-12: Found 65892 pages to be handled by UFFD
(02.315777) uffd: 28398-12: uffd_copy: 0x7ffd9f26e000/4096
(02.315792) uffd: 28398-12: UFFD transferred pages: (65892/65892)
(02.315800) uffd: 28399-13: UFFD transferred pages: (10/12)
`
	if err := os.WriteFile(log, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := ReadLazyPagesStats(log)
	if err != nil || *st != (LazyPagesStats{Tasks: 2, Copied: 65902, Total: 65904}) {
		t.Errorf("ReadLazyPagesStats = %+v, %v", st, err)
	}
	if _, err := ReadLazyPagesStats(log + ".missing"); err == nil {
		t.Error("missing log accepted")
	}
}

// A daemon that dies during the restore: the restore's error carries its
// error and log too, on one line.
func TestRestoreLazyDaemonDiesFirst(t *testing.T) {
	img, work := lazyDirs(t)
	listenLazySocket(t, work)
	criu := fakeCRIU(t, `if [ "$CMD" != lazy-pages ]; then sleep 0.5; exit 1; fi
printf '\0' >&3; exec 3>&-
echo "(00.100000) Error (criu/uffd.c:3): uffd: 42-12: Failed to open pagemap" >> "$W/$L"
exit 1
`)
	_, err := Restore(context.Background(), criu, RestoreOptions{ImagesDir: img, WorkDir: work, LazyPages: true})
	var ce *Error
	msg := fmt.Sprint(err)
	if !errors.As(err, &ce) || ce.Op != "restore" || !strings.Contains(msg, "Failed to open pagemap (log: "+filepath.Join(work, DefaultLazyPagesLog)+")") ||
		!strings.Contains(msg, "swrk") || strings.Contains(msg, "\n") {
		t.Errorf("Restore with a dying daemon = %v", err)
	}
	t.Logf("%v", err)

	// The daemon's going away because the restore failed is no news.
	work = t.TempDir()
	listenLazySocket(t, work)
	criu = fakeCRIU(t, `if [ "$CMD" != lazy-pages ]; then sleep 0.3; exit 1; fi
printf '\0' >&3; exec 3>&-
sleep 0.1
echo "(00.100000) Error (criu/uffd.c:4): uffd: PID recv: short read" >> "$W/$L"
exit 1
`)
	_, err = Restore(context.Background(), criu, RestoreOptions{ImagesDir: img, WorkDir: work, LazyPages: true})
	if err == nil || strings.Contains(err.Error(), "lazy-pages") {
		t.Errorf("Restore = %v", err)
	}
}
