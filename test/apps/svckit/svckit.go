// Package svckit is what the criu package's test services (criuhelper,
// lazyheap) share: starting a detached copy of themselves, publishing their
// address and serving it.
package svckit

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Detach starts a copy of this program with the flags that were set on the
// command line, except -daemon and -out, as CRIU wants a target: in a
// session of its own, stdin /dev/null, output appended to out.
func Detach(out string) (*exec.Cmd, error) {
	if out == "" {
		return nil, errors.New("-daemon needs -out")
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var args []string
	flag.Visit(func(fl *flag.Flag) {
		if fl.Name != "daemon" && fl.Name != "out" {
			args = append(args, "-"+fl.Name+"="+fl.Value.String())
		}
	})
	cmd := exec.Command(os.Args[0], args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd, cmd.Start()
}

// WriteAddr writes addr to path atomically, so that a reader polling for
// the file never sees half of it.
func WriteAddr(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Serve calls handle with every connection ln accepts, forever. A failed
// accept is printed and retried: a test service must outlive a restore.
func Serve(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Println("accept:", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		handle(c)
	}
}
