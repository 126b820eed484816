// Package pidone does the duties of PID 1 for a program that is the first
// process of a PID namespace (a container's entrypoint): it runs the
// program again as its only child, reaps every process orphaned in the
// namespace, forwards the signals it gets to the child, and exits as the
// child does. The program's own children are the child's to wait for, so
// that reaping orphans never takes an exit status os/exec waits for.
package pidone

import (
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Run runs argv (argv[0] is the path, such as /proc/self/exe; argv[1:] the
// arguments) with env as its child and returns the exit code to exit
// with: the child's, or 128+N if signal N killed it.
func Run(path string, argv, env []string) (int, error) {
	sigs := make(chan os.Signal, 16)
	// Every signal, before the child exists: none sent meanwhile is lost.
	signal.Notify(sigs)
	defer signal.Stop(sigs)
	p, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		// If this process dies, so does the child (and with the
		// namespace's init gone, the kernel ends the namespace). In a
		// process group of its own, it gets a terminal's ^C once: from
		// here.
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true},
	})
	if err != nil {
		return 1, err
	}
	// A SIGCHLD dropped from a full channel must not leave zombies: reap
	// every second too.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if code, done := reap(p.Pid); done {
			return code, nil
		}
		var sig os.Signal
		select {
		case sig = <-sigs:
		case <-tick.C:
			continue
		}
		s, ok := sig.(syscall.Signal)
		if !ok || s == syscall.SIGCHLD || s == syscall.SIGURG || s == syscall.SIGPIPE {
			// SIGCHLD: reap above. SIGURG is the Go runtime's own.
			continue
		}
		syscall.Kill(p.Pid, s)
	}
}

// reap reaps every exited child without blocking, and reports the exit
// code of child once it exited.
func reap(child int) (code int, done bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return code, done
		}
		if pid != child {
			continue
		}
		switch {
		case ws.Exited():
			code, done = ws.ExitStatus(), true
		case ws.Signaled():
			code, done = 128+int(ws.Signal()), true
		}
	}
}
