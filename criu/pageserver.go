package criu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SessionOptions configures StartDumpSession.
type SessionOptions struct {
	// ShellJob must match the dump's DumpOptions.ShellJob.
	ShellJob bool
	// Abandonable makes a cancelled dump end within a chunk of pages,
	// with the tree resumed: CRIU sends the memory pages over a socket
	// pair to a second CRIU, a page server that writes them into the
	// images directory, and cancelling shuts that pair down, so that the
	// dumping CRIU fails its next write, cures the tree and resumes it
	// ("Dumping FAILED"). Without it, CRIU notices a cancel only at its
	// post-dump stage, once every page is written.
	Abandonable bool
}

// pageServerGrace is how long an abandoned page server has to exit.
const pageServerGrace = 10 * time.Second

// psFD is the page server's socket in the dumping CRIU's fd table: after
// the swrk socket (fd 3).
const psFD = 4

// PageServerLog is the page server's log in the images directory.
const PageServerLog = "page-server.log"

// pageServer is the CRIU page server of an abandonable dump and the
// socket pair between it and the dumping CRIU.
type pageServer struct {
	dumpEnd   *os.File // the dumping CRIU's end (its fd psFD); kcr keeps it to shut the pair down
	serverEnd *os.File // the page server's end, handed over at start
	cmd       *exec.Cmd
	out       *os.File // memfd with the page server's output
	stop      func() bool
	done      chan struct{} // closed once cmd was waited for
	waitErr   error
}

func newPageServer() (*pageServer, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("criu: page server socketpair: %w", err)
	}
	return &pageServer{dumpEnd: os.NewFile(uintptr(fds[0]), "criu-ps-dump"), serverEnd: os.NewFile(uintptr(fds[1]), "criu-ps-server")}, nil
}

// start runs "criu page-server" on the server's end, writing into dir (an
// open directory, handed over as an fd: no path is looked up again);
// cancelling ctx shuts the pair down (see SessionOptions.Abandonable).
func (ps *pageServer) start(ctx context.Context, criuPath string, dir *os.File, logLevel int32) error {
	out, err := memfd("criu-page-server-output")
	if err != nil {
		return err
	}
	cmd := exec.Command(criuPath, "page-server", "--images-dir", "/proc/self/fd/4", "--ps-socket", "3",
		"--log-file", PageServerLog, "-v"+fmt.Sprint(logLevel))
	cmd.ExtraFiles = []*os.File{ps.serverEnd, dir}
	cmd.Stdout, cmd.Stderr = out, out
	// Terminal signals go to kcr's group, not to it (as for swrk). It is
	// never killed while it may start (nor dies with kcr, no Pdeathsig): at
	// its start CRIU probes the CPU through a helper it forks and kills a
	// few ms later, and a page server killed in between leaves the helper
	// asleep for good, holding the images directory. It ends on its own
	// instead, at the end of its input: a shutdown of the pair, or the exit
	// of the dumping CRIU and of kcr, the two holders of the other end. (A
	// PID namespace of its own would take the helper along, but a page
	// server in one fails in a container: "Can't send PSI 4 to server".)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("criu: start %s page-server: %w", criuPath, err)
	}
	ps.serverEnd.Close()
	ps.serverEnd = nil
	ps.cmd, ps.out, ps.done = cmd, out, make(chan struct{})
	go func() {
		ps.waitErr = cmd.Wait()
		close(ps.done)
	}()
	ps.stop = context.AfterFunc(ctx, ps.abandon)
	return nil
}

// abandon shuts the socket pair down: the dumping CRIU's next page write
// fails and the page server reads the end of its input.
func (ps *pageServer) abandon() {
	rc, err := ps.dumpEnd.SyscallConn()
	if err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
	}
}

// finish waits for the page server once the dump is over and returns an
// error if it did not exit 0 after a successful dump. With abandon (the dump
// failed, it need not finish) the pair is shut down first: the server reads
// the end of its input and exits; it is killed only if it has not exited
// pageServerGrace later, long after its start.
func (ps *pageServer) finish(abandon bool) error {
	if ps.stop != nil {
		ps.stop()
	}
	if ps.serverEnd != nil {
		ps.serverEnd.Close()
	}
	if abandon {
		ps.abandon()
	}
	// The page server sees the end of its input once the dumping CRIU is
	// gone too.
	ps.dumpEnd.Close()
	if ps.cmd == nil {
		return nil
	}
	select {
	case <-ps.done:
	case <-time.After(pageServerGrace):
		_ = ps.cmd.Process.Kill()
	}
	<-ps.done
	defer ps.out.Close()
	if ps.waitErr == nil || abandon {
		return nil
	}
	var output string
	if _, err := ps.out.Seek(0, io.SeekStart); err == nil {
		b, _ := io.ReadAll(io.LimitReader(ps.out, 64<<10))
		output = strings.Join(strings.Fields(string(b)), " ")
	}
	err := fmt.Errorf("criu page-server: %w", ps.waitErr)
	if output != "" {
		err = errors.Join(err, fmt.Errorf("criu said: %s", output))
	}
	return err
}
