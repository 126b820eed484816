package engine

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInheritedFDs marks every descriptor above stderr close-on-exec, so
// that none reaches a program kcr starts unless handed on deliberately
// (os/exec's ExtraFiles are dup'ed into place in the child whatever their
// flag). kcr's own descriptors are close-on-exec already; those it
// inherited without the flag (a shell's, a test harness's) are not, and a
// service that got one could not be checkpointed: CRIU finds no mount for
// a file of a mount namespace that is not the service's. kcr takes no
// descriptor from its parent (it hands LISTEN_FDS to the service from a
// socket of its own, and does not read any itself).
func CloseInheritedFDs() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
	return nil
}
