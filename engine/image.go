package engine

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/notify/proto"
)

// An image's start and what its manifest says of the process and the host,
// for engine's checkpoints and the container package's.

// CreateImage starts the image out, signed with key if not nil. Callers
// defer b.Abort() at once: it removes the unfinished image on every failure
// and is a no-op after a successful Commit.
func CreateImage(out string, key ed25519.PrivateKey) (*images.Builder, error) {
	b, err := images.Create(out)
	if err != nil {
		return nil, err
	}
	b.SignWith(key)
	return b, nil
}

// ProcessInfo describes a live process from /proc, as a manifest records it.
func ProcessInfo(pid int) (images.Process, error) {
	p := images.Process{PID: pid}
	dir := "/proc/" + strconv.Itoa(pid)
	if _, err := os.Stat(dir); err != nil {
		return p, fmt.Errorf("PID %d: %w: check the PID (ps -p %d)", pid, proto.ErrNoProcess, pid)
	}
	if st, err := procfs.ReadStat(pid); err == nil && st.Zombie() {
		return p, fmt.Errorf("PID %d is a zombie: %w", pid, proto.ErrNoProcess)
	}
	p.Exe, _ = os.Readlink(dir + "/exe")
	p.Cwd, _ = os.Readlink(dir + "/cwd")
	if b, err := os.ReadFile(dir + "/cmdline"); err == nil {
		p.Cmdline = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	if b, err := os.ReadFile(dir + "/comm"); err == nil {
		p.Comm = strings.TrimSpace(string(b))
	}
	if st, err := procfs.ReadStatus(pid); err == nil {
		p.UID = int(st.UIDs[0])
		p.PIDNamespace = st.OwnPIDNamespace()
		p.RSSBytes = st.RSSBytes
	}
	return p, nil
}

// Hostname is this host's name, as a manifest records it.
func Hostname() string {
	h, _ := os.Hostname()
	return h
}

// Kernel is the running kernel's release, as a manifest records it.
func Kernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
