package standby

import (
	"bytes"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// LogStdio is the Options.Log that sends the service's stdout and stderr
// to kcr standby's own (Options.ServiceStdout, Options.ServiceStderr).
const LogStdio = "-"

// maxLine bounds a line kept whole: a longer one is passed on in pieces
// of this size, so that memory stays bounded.
const maxLine = 1 << 20

// pipeSize is the size asked for each pipe (at most
// /proc/sys/fs/pipe-max-size for a process without CAP_SYS_RESOURCE): it
// holds what the service writes while kcr standby cannot read, so that the
// service seldom blocks on its log.
const pipeSize = 1 << 20

// serviceOutput carries the service's stdout and stderr to two writers
// through a pipe each, kept by kcr standby for its whole life: every start
// gets their write ends, and every restore gets them back in place of the
// pipes CRIU dumped (engine.RestoreOptions.Stdout), so the readers see one
// stream across checkpoints. A line goes on whole, in one Write, once its
// newline is read.
type serviceOutput struct {
	stdout, stderr *os.File // the write ends
	done           sync.WaitGroup
}

func newServiceOutput(stdout, stderr io.Writer) (*serviceOutput, error) {
	o := &serviceOutput{}
	var err error
	if o.stdout, err = o.pipe(stdout); err != nil {
		return nil, err
	}
	if o.stderr, err = o.pipe(stderr); err != nil {
		o.stdout.Close()
		return nil, err
	}
	return o, nil
}

// pipe makes one pipe and starts its reader; it returns the write end.
func (o *serviceOutput) pipe(to io.Writer) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	// Best effort: the default 64 KiB does too.
	_, _ = unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, pipeSize)
	o.done.Add(1)
	go func() {
		defer o.done.Done()
		defer r.Close()
		forwardLines(r, to)
	}()
	return w, nil
}

// close closes kcr standby's write ends and waits up to wait for the
// readers to pass on what is left: they end once no copy of the service
// holds the pipes (one left running keeps them open).
func (o *serviceOutput) close(wait time.Duration) {
	if o == nil {
		return
	}
	o.stdout.Close()
	o.stderr.Close()
	done := make(chan struct{})
	go func() {
		o.done.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
	}
}

// forwardLines copies r to w until r ends, whole lines only: each Write
// holds every complete line read so far; a last line without a newline
// goes at the end. Errors of w are ignored (the lines are dropped; the
// service must not block on a closed stdout).
func forwardLines(r io.Reader, w io.Writer) {
	buf := make([]byte, 0, 64<<10)
	for {
		if len(buf) == cap(buf) {
			if cap(buf) >= maxLine {
				_, _ = w.Write(buf)
				buf = buf[:0]
			} else {
				nb := make([]byte, len(buf), min(2*cap(buf), maxLine))
				buf = nb[:copy(nb, buf)]
			}
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if i := bytes.LastIndexByte(buf[len(buf)-n:], '\n'); i >= 0 {
			end := len(buf) - n + i + 1
			_, _ = w.Write(buf[:end])
			buf = buf[:copy(buf, buf[end:])]
		}
		if err != nil {
			if len(buf) > 0 {
				_, _ = w.Write(buf)
			}
			return
		}
	}
}
