package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// capNames are the capabilities by name (capabilities(7)), without CAP_.
var capNames = []string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

// ParseCaps parses capability names (NET_BIND_SERVICE or
// CAP_NET_BIND_SERVICE, any case) into their numbers.
func ParseCaps(names []string) ([]uintptr, error) {
	var caps []uintptr
	for _, n := range names {
		u := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(n)), "CAP_")
		i := slices.Index(capNames, u)
		if i < 0 {
			return nil, fmt.Errorf("capability %q: unknown: give a name of capabilities(7), such as NET_BIND_SERVICE", n)
		}
		if !slices.Contains(caps, uintptr(i)) {
			caps = append(caps, uintptr(i))
		}
	}
	return caps, nil
}

// CapName is the name of capability c (CAP_ and all).
func CapName(c uintptr) string {
	if int(c) < len(capNames) {
		return "CAP_" + capNames[c]
	}
	return "CAP_" + strconv.Itoa(int(c))
}

// ParseUser parses USER[:GROUP], each a name or a number, into the
// credentials a program runs with. Without GROUP, the user's primary
// group; the supplementary groups are groups (names or numbers), none by
// default.
func ParseUser(spec string, groups []string) (*syscall.Credential, error) {
	name, grp, hasGroup := strings.Cut(spec, ":")
	c := &syscall.Credential{NoSetGroups: false, Groups: []uint32{}}
	if uid, err := strconv.ParseUint(name, 10, 32); err == nil {
		c.Uid, c.Gid = uint32(uid), uint32(uid)
		if u, err := user.LookupId(name); err == nil {
			if gid, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
				c.Gid = uint32(gid)
			}
		}
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("--user %s: no such user: give a uid, or a name in /etc/passwd", spec)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		c.Uid, c.Gid = uint32(uid), uint32(gid)
	}
	if hasGroup {
		gid, err := parseGroup(grp)
		if err != nil {
			return nil, fmt.Errorf("--user %s: %w", spec, err)
		}
		c.Gid = gid
	}
	for _, g := range groups {
		gid, err := parseGroup(g)
		if err != nil {
			return nil, fmt.Errorf("--user-groups: %w", err)
		}
		c.Groups = append(c.Groups, gid)
	}
	return c, nil
}

func parseGroup(g string) (uint32, error) {
	if gid, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uint32(gid), nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("group %q: no such group: give a gid, or a name in /etc/group", g)
	}
	gid, _ := strconv.ParseUint(gr.Gid, 10, 32)
	return uint32(gid), nil
}

// serviceCaps are the capabilities a service keeps: caps, and
// CAP_SYS_ADMIN in a PID namespace of its own, without which CRIU cannot
// dump it ("can't dump unprivileged task whose /proc doesn't belong to
// it": its parasite mounts a proc of the namespace as the task).
func serviceCaps(caps []uintptr, pidns bool) []uintptr {
	if pidns && !slices.Contains(caps, unix.CAP_SYS_ADMIN) {
		caps = append(slices.Clip(caps), unix.CAP_SYS_ADMIN)
	}
	return caps
}

// startConfined starts cmd with only the capabilities keep: from an OS
// thread of its own whose bounding set holds only keep, whose inheritable
// and ambient sets are empty and which has no_new_privs, all of which the
// child inherits; keep is raised ambient in the child, so that a non-root
// uid keeps it across execve. The thread ends with its goroutine, its
// reduced privileges with it: kcr's other threads keep what CRIU needs.
func startConfined(cmd *exec.Cmd, keep []uintptr) error {
	cmd.SysProcAttr.AmbientCaps = keep
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: Go ends a locked thread whose goroutine exits.
		runtime.LockOSThread()
		if err := confineThread(keep); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// confineThread drops from the calling thread every capability but keep
// from the bounding set, empties its inheritable and ambient sets and sets
// no_new_privs.
func confineThread(keep []uintptr) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := uintptr(0); c <= last; c++ {
		if slices.Contains(keep, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if errors.Is(err, syscall.EPERM) && !hasPermitted() {
				// kcr holds no capability: nothing to drop that the
				// service could use (no_new_privs stops file
				// capabilities and set-user-ID programs).
				break
			}
			return fmt.Errorf("drop %s from the service's bounding set: %w", CapName(c), err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the service's ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear the service's inheritable capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs for the service: %w", err)
	}
	return nil
}

// hasPermitted reports whether the calling thread has any permitted
// capability.
func hasPermitted() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return true
	}
	return data[0].Permitted != 0 || data[1].Permitted != 0
}

// lastCap is the highest capability the kernel knows.
func lastCap() (uintptr, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("/proc/sys/kernel/cap_last_cap: %q", b)
	}
	return uintptr(n), nil
}
