package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/criu"
)

// Check is one finding of Doctor.
type Check struct {
	Name   string `json:"name"`   // what was checked
	OK     bool   `json:"ok"`     // whether it passed
	Detail string `json:"detail"` // what was found
	Fix    string `json:"fix"`    // how to fix a failed check; "" when OK
}

// Doctor checks that this machine can checkpoint and restore: CRIU found,
// recent enough for the kernel, "criu check" passing, privileges and the
// kernel features kcr relies on.
func Doctor(ctx context.Context, explicitCRIU string) []Check {
	var out []Check
	add := func(name string, ok bool, detail, fix string) {
		c := Check{Name: name, OK: ok, Detail: detail}
		if !ok {
			c.Fix = fix
		}
		out = append(out, c)
	}
	rel, _ := criu.KernelRelease()

	path, err := criu.Find(explicitCRIU)
	if err != nil {
		add("criu", false, err.Error(), "run scripts/install-criu.sh")
	} else {
		add("criu", true, path, "")
		v, err := criu.ReadVersion(ctx, path)
		if err != nil {
			add("criu version", false, err.Error(), "reinstall CRIU with scripts/install-criu.sh")
		} else if err := criu.CheckKernel(v, rel); err != nil {
			add("criu version", false, err.Error(), "run scripts/install-criu.sh")
		} else {
			add("criu version", true, fmt.Sprintf("%s on kernel %s", v, rel), "")
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		outp, err := criu.Check(cctx, path)
		cancel()
		lines := strings.Split(strings.TrimSpace(outp), "\n")
		last := lines[len(lines)-1]
		add("criu check", err == nil, last, "see `"+path+" check` output; usually a kernel without CONFIG_CHECKPOINT_RESTORE")
	}

	root := os.Geteuid() == 0
	capOK := root
	detail := fmt.Sprintf("euid %d", os.Geteuid())
	if hdr, data := (unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}), [2]unix.CapUserData{}; unix.Capget(&hdr, &data[0]) == nil {
		has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
		sys := has(unix.CAP_SYS_ADMIN)
		cr := has(unix.CAP_CHECKPOINT_RESTORE)
		capOK = sys || (cr && has(unix.CAP_SYS_PTRACE))
		detail += fmt.Sprintf(", CAP_SYS_ADMIN=%v CAP_CHECKPOINT_RESTORE=%v", sys, cr)
	}
	add("privileges", capOK, detail, "run kcr as root (or with CAP_CHECKPOINT_RESTORE, CAP_SYS_PTRACE)")
	if hdr, data := (unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}), [2]unix.CapUserData{}; root && unix.Capget(&hdr, &data[0]) == nil {
		eff := uint64(data[0].Effective) | uint64(data[1].Effective)<<32
		out = append(out, stepCapsCheck(eff))
		b, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
		if c, ok := lazyCapNote(eff, strings.TrimSpace(string(b)) == "1"); ok {
			out = append(out, c)
		}
	}

	_, err = os.Stat("/proc/self/map_files")
	add("kernel: checkpoint/restore", err == nil, "/proc/self/map_files", "use a kernel built with CONFIG_CHECKPOINT_RESTORE=y")
	_, err = os.Stat("/proc/sys/kernel/ns_last_pid")
	add("kernel: PID control", err == nil, "/proc/sys/kernel/ns_last_pid", "use a kernel built with CONFIG_CHECKPOINT_RESTORE=y")
	_, err = os.Stat("/proc/self/ns/time")
	add("kernel: time namespaces", err == nil, "/proc/self/ns/time (restored processes keep their monotonic clock)", "use a kernel >= 5.6 with CONFIG_TIME_NS")
	uffd := fileExists("/dev/userfaultfd") || fileExists("/proc/sys/vm/unprivileged_userfaultfd")
	add("kernel: userfaultfd", uffd, "needed only for lazy restore", "use a kernel with CONFIG_USERFAULTFD=y")
	if !strings.Contains(os.Getenv("GODEBUG"), "multipathtcp=0") {
		out = append(out, Check{Name: "note: MPTCP", OK: true,
			Detail: "Go >= 1.24 listens with MPTCP by default and CRIU cannot dump MPTCP: run services with GODEBUG=multipathtcp=0, or add `godebug multipathtcp=0` to their go.mod"})
	}
	var st unix.Statfs_t
	if unix.Statfs("/run", &st) == nil {
		if c, ok := kdatCacheNote(int64(st.Type)); ok {
			out = append(out, c)
		}
	}
	return out
}

// stepCaps are the capabilities CRIU's steps need of a root kcr (in a
// container, where root may lack some), and why.
var stepCaps = []struct {
	cap uintptr
	why string
}{
	{unix.CAP_SYS_ADMIN, "the service's PID namespace, CRIU's dump and restore"},
	{unix.CAP_NET_ADMIN, "CRIU's netlink requests (socket diagnostics)"},
	{unix.CAP_SYS_TIME, "the restored time namespace's clock offsets: without it every restore fails and kcr standby starts cold"},
	{unix.CAP_SYS_CHROOT, "CRIU's change of root while restoring"},
}

// stepCapsCheck checks the effective capabilities eff for each of
// stepCaps.
func stepCapsCheck(eff uint64) Check {
	var missing, fix []string
	for _, c := range stepCaps {
		if eff&(1<<c.cap) == 0 {
			missing = append(missing, CapName(c.cap))
			fix = append(fix, CapName(c.cap)+": "+c.why)
		}
	}
	if len(missing) == 0 {
		return Check{Name: "capabilities for checkpoint and restore", OK: true, Detail: "CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_TIME, CAP_SYS_CHROOT"}
	}
	return Check{Name: "capabilities for checkpoint and restore", Detail: "missing " + strings.Join(missing, ", "),
		Fix: "add them to the container's capabilities (" + strings.Join(fix, "; ") + ")"}
}

// lazyCapNote warns when --lazy restores cannot work: CRIU's lazy-pages
// daemon opens a userfaultfd, which takes CAP_SYS_PTRACE unless
// vm.unprivileged_userfaultfd is 1. Only a note: a plain restore needs
// neither.
func lazyCapNote(eff uint64, unprivUffd bool) (Check, bool) {
	if eff&(1<<unix.CAP_SYS_PTRACE) != 0 || unprivUffd {
		return Check{}, false
	}
	return Check{Name: "note: lazy restore", OK: true,
		Detail: "without CAP_SYS_PTRACE (and vm.unprivileged_userfaultfd=0) CRIU cannot open a userfaultfd: every --lazy restore fails and kcr standby starts the service cold; add SYS_PTRACE to the container's capabilities or restore without --lazy"}, true
}

// kdatCacheNote warns when CRIU cannot keep its kernel-feature cache
// (/run/criu.kdat, kept only on tmpfs): every CRIU run then probes the
// kernel again, a cost docs/benchmarks.md measures.
func kdatCacheNote(runFSType int64) (Check, bool) {
	if runFSType == unix.TMPFS_MAGIC {
		return Check{}, false
	}
	return Check{Name: "note: CRIU kernel cache", OK: true,
		Detail: "/run is not tmpfs, so CRIU cannot keep /run/criu.kdat and probes the kernel on every dump and restore: make /run a tmpfs, as systemd does"}, true
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
