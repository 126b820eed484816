package criu

import (
	"bufio"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
)

// Cause classifies a CRIU failure that kcr knows how to explain. It is an
// error only so that callers can test for one with errors.Is, which an
// *Error with that Cause matches: errors.Is(err, criu.CausePIDInUse).
type Cause string

// Known causes. CauseUnknown means the log matched no known pattern.
const (
	CauseUnknown        Cause = ""
	CauseTCPEstablished Cause = "tcp-established"
	CauseExternalUnix   Cause = "external-unix-socket"
	CausePIDInUse       Cause = "pid-in-use"
	CauseMPTCP          Cause = "mptcp"
	CausePermission     Cause = "permission"
	CauseShellJob       Cause = "shell-job"
	CauseNoProcess      Cause = "no-such-process"
	CauseTCPCloseNeeded Cause = "tcp-close-needed"
	// CauseUnixBindInUse: a Unix socket path the image binds is taken.
	CauseUnixBindInUse Cause = "unix-bind-in-use"
	// CauseFileVanished: a file CRIU had just restored (such as a bound
	// socket) was removed before CRIU set its owner.
	CauseFileVanished Cause = "file-vanished"
	// CauseRestoreGone: a lazy-pages daemon lost the restore it served,
	// which failed for reasons of its own.
	CauseRestoreGone Cause = "restore-gone"
	// CauseDiskFull: CRIU could not write (its image, log or work files)
	// because the disk or the quota is full: not the image's fault.
	CauseDiskFull Cause = "disk-full"
	// CauseMountLookup: the process holds a descriptor on a file whose
	// mount CRIU cannot find in the process's mount namespace (one
	// inherited from outside it, such as a shell's /dev/null): no
	// privilege is missing.
	CauseMountLookup Cause = "mount-lookup"
	// CauseSeccomp: CRIU runs under a seccomp filter and dumps a process
	// that has one, which the kernel allows only an unfiltered tracer.
	CauseSeccomp Cause = "seccomp"
)

// Error returns the cause's name.
func (c Cause) Error() string { return string(c) }

var hints = map[Cause]string{
	CauseTCPEstablished: "a TCP connection is still open: close it in a hook (a Kafka client's: wrap the client with kafkahooks or kgohooks, never --tcp-close, which keeps its producer id and group membership in the image), or pass --tcp-close for a connection that is not a Kafka client's",
	CauseExternalUnix:   "a connected Unix socket leads outside the process: close it in a hook",
	CausePIDInUse:       "a PID the image needs is in use by another process: restore needs the original PIDs; stop that process, or run the service under \"kcr run\" so it gets its own PID namespace",
	CauseMPTCP:          "MPTCP socket: Go >= 1.24 listens with MPTCP by default; set GODEBUG=multipathtcp=0, add `godebug multipathtcp=0` to go.mod, or ListenConfig.SetMultipathTCP(false)",
	CausePermission:     "run as root (CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE)",
	CauseShellJob:       "the process is not detached (it does not lead its own session, or it has a controlling terminal): start it with setsid and stdin from /dev/null, or pass --shell-job",
	CauseNoProcess:      "the process is gone: check the PID",
	CauseTCPCloseNeeded: "the image was dumped with --tcp-close: restore it with --tcp-close too",
	CauseUnixBindInUse:  "a Unix socket path the image binds is in use: stop the process that holds it, or remove the stale socket file",
	CauseFileVanished:   "another process removed a file CRIU had just restored (clones of one image restoring at once?): try again",
	CauseRestoreGone:    "the restore failed first: see its error",
	CauseDiskFull:       "the disk (or quota) of the image or CRIU's work directory is full: free space and try again",
	CauseSeccomp:        "kcr and CRIU run under a seccomp filter (a container's seccompProfile other than Unconfined), and the kernel lets only a tracer without one suspend the seccomp filter of the process it dumps: run kcr without a seccomp filter (seccompProfile: Unconfined)",
	CauseMountLookup:    "the process holds a file descriptor (named above) on a mount CRIU cannot find in the process's mount namespace, usually one inherited from outside it: start the process without that descriptor (close-on-exec, or stdin from a file inside its namespace); no privilege is missing",
}

// rootPermissionHint replaces "run as root" when kcr already runs as root:
// then something between CRIU and the kernel refused it.
const rootPermissionHint = "CRIU was refused an operation although kcr runs as root: a container without CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE, CAP_SYS_PTRACE), a seccomp filter, an AppArmor or SELinux profile, or a user namespace: see the log line named above"

// Hint returns the advice kcr gives for c ("" for CauseUnknown).
func (c Cause) Hint() string {
	if c == CausePermission && geteuid() == 0 {
		return rootPermissionHint
	}
	return hints[c]
}

// geteuid is os.Geteuid; tests change it.
var geteuid = os.Geteuid

// causePatterns are tried in order on every error line of a log; the first
// cause found anywhere in the log wins over later ones in this list. They
// are compiled on first use: every kcr command links this package, and
// compiling at init would slow each start for the few that read a log.
var causePatterns = sync.OnceValue(func() []causePattern {
	return []causePattern{
		// First: a full disk explains the errors that follow it.
		{CauseDiskFull, regexp.MustCompile(`No space left on device|Disk quota exceeded`)},
		{CauseMPTCP, regexp.MustCompile(`Unsupported proto 262|IPPROTO_MPTCP|proto 262`)},
		{CauseTCPCloseNeeded, regexp.MustCompile(`Need to set the --tcp-close option`)},
		{CauseTCPEstablished, regexp.MustCompile(`(?i)connected TCP socket|tcp-established|TCP connection`)},
		{CauseExternalUnix, regexp.MustCompile(`(?i)external socket is used|ext-unix-sk|half of stream unix connection|unix socket .* without peer|Runaway socket`)},
		{CausePIDInUse, regexp.MustCompile(`Can't fork for \d+: File exists|PID \d+ is in use`)},
		{CauseUnixBindInUse, regexp.MustCompile(`Can't bind .*Address already in use`)},
		// cr_fchpermat chowns, then stats: the file can go before either.
		{CauseFileVanished, regexp.MustCompile(`Unable to (?:change \[-?\d+\]/.* ownership .*|stat \[-?\d+\]/.*): No such file or directory`)},
		// Before a refusal and a vanished process: CRIU detaches from
		// the process after it, which fails with No such process.
		{CauseSeccomp, regexp.MustCompile(`suspending seccomp failed`)},
		{CauseShellJob, regexp.MustCompile(`(?i)not a session leader|shell-job|shell_job|controlling terminal`)},
		{CauseNoProcess, regexp.MustCompile(`No such process`)},
		{CausePermission, regexp.MustCompile(`(?i)operation not permitted|permission denied|CAP_SYS_ADMIN|CAP_CHECKPOINT_RESTORE|capability .* missing`)},
		// After a refusal: a descriptor's mount CRIU could not read about
		// may be one it was refused.
		{CauseMountLookup, regexp.MustCompile(`Can't lookup mount=\d+ for fd=\d+`)},
		// Last: any other cause in the daemon's log is news.
		{CauseRestoreGone, regexp.MustCompile(`PID recv|Restorer unexpectedly closed`)},
	}
})

type causePattern struct {
	cause Cause
	re    *regexp.Regexp
}

// logLineRE splits "(00.012345) Error (criu/sk-inet.c:188): message".
var logLineRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^\s*(?:\(\s*[0-9.]+\)\s*)?(?:pie: \d+: )?(?:\d+: )?(Error|Warn) \(([^)]*)\): ?(.*)$`)
})

// harmless reports error lines CRIU prints that do not explain a failure:
// when kcr runs without CAP_SYS_RESOURCE (containers, some VMs) CRIU cannot
// raise its rlimits and logs an Operation not permitted error, then carries
// on; in a user namespace its probe of the kernel cannot create a tun
// device, and it carries on too.
func harmless(msg string) bool {
	l := strings.ToLower(msg)
	if strings.HasPrefix(l, "tun: unable to create tun:") {
		return true
	}
	return (strings.Contains(l, "rlimit") || strings.Contains(l, "rlim_") || strings.Contains(l, "nr_open")) &&
		(strings.Contains(l, "not permitted") || strings.Contains(l, "cap_sys_resource"))
}

// ParseLog scans a CRIU log and returns the first real error message (its
// "Error (file:line): " prefix removed, harmless rlimit errors skipped) and a
// hint if a known cause appears anywhere in the log's error lines.
func ParseLog(r io.Reader) (first, hint string) {
	first, c := parseLog(r)
	return first, c.Hint()
}

// ParseLogFile is ParseLog on a file; a missing file gives "", "".
func ParseLogFile(path string) (first, hint string) {
	first, c := parseLogFile(path)
	return first, c.Hint()
}

func parseLogFile(path string) (string, Cause) {
	f, err := os.Open(path)
	if err != nil {
		return "", CauseUnknown
	}
	defer f.Close()
	return parseLog(f)
}

func parseLog(r io.Reader) (first string, cause Cause) {
	rank := len(causePatterns())
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := logLineRE().FindStringSubmatch(sc.Text())
		if m == nil || m[1] != "Error" {
			continue
		}
		msg := strings.TrimSpace(m[3])
		if msg == "" || harmless(msg) {
			continue
		}
		isFirst := first == ""
		if isFirst {
			first = msg
		}
		cause, rank = classify(msg, isFirst, cause, rank)
	}
	return first, cause
}

// classify returns the cause msg matches if it ranks before the cause found
// so far (rank is that cause's index in causePatterns). A refusal counts
// only in the first real error line (first): after another failure, CRIU's
// clean-up can be refused too, and a hint about privileges would then
// blame the wrong thing.
func classify(msg string, first bool, cause Cause, rank int) (Cause, int) {
	ps := causePatterns()
	for i := 0; i < rank; i++ {
		if ps[i].cause == CausePermission && !first {
			continue
		}
		if ps[i].re.MatchString(msg) {
			return ps[i].cause, i
		}
	}
	return cause, rank
}

// parseOutput is parseLog for what criu printed on stdout/stderr before it
// had a log file (e.g. "CRIU needs to have the CAP_SYS_ADMIN or the
// CAP_CHECKPOINT_RESTORE capability"): every non-empty line counts.
func parseOutput(out string) (first string, cause Cause) {
	rank := len(causePatterns())
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || harmless(line) {
			continue
		}
		if m := logLineRE().FindStringSubmatch(line); m != nil {
			if m[1] != "Error" {
				continue
			}
			line = strings.TrimSpace(m[3])
		}
		isFirst := first == ""
		if isFirst {
			first = strings.TrimSuffix(line, ":")
		}
		cause, rank = classify(line, isFirst, cause, rank)
	}
	return first, cause
}

// Error is a failed CRIU operation.
type Error struct {
	Op    string // "dump", "restore", ...
	First string // first real error line of CRIU's log, prefix removed
	Log   string // path of CRIU's log file ("" if none)
	Cause Cause  // recognised cause, or CauseUnknown
	Hint  string // advice for Cause ("" if none)
	// Err is the underlying error when there is one: a failed hook, the
	// error CRIU reported over RPC, or how the criu process ended.
	Err error
}

// Error formats e as one line:
// "criu dump failed: <first error> (log: <path>); hint: <hint>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("criu ")
	b.WriteString(e.Op)
	b.WriteString(" failed")
	switch {
	case e.First != "":
		b.WriteString(": ")
		b.WriteString(e.First)
	case e.Err != nil:
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.Log != "" {
		b.WriteString(" (log: ")
		b.WriteString(e.Log)
		b.WriteString(")")
	}
	if e.Hint != "" {
		b.WriteString("; hint: ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is e's Cause, so that errors.Is(err,
// criu.CausePIDInUse) finds the cause through any wrapping.
func (e *Error) Is(target error) bool {
	c, ok := target.(Cause)
	return ok && c != CauseUnknown && c == e.Cause
}

// newError builds an *Error for op from the log at logPath and, failing
// that, from what criu printed (output).
func newError(op, logPath, output string, err error) *Error {
	first, c := parseLogFile(logPath)
	if _, statErr := os.Stat(logPath); statErr != nil {
		logPath = ""
	}
	if first == "" {
		// What criu printed is read only when its log explains nothing:
		// beside a real error in the log, a line there (CRIU's service
		// setup, such as its rlimit without CAP_SYS_RESOURCE) would give
		// its cause, and a hint about capabilities, to an unrelated
		// failure.
		first, c = parseOutput(output)
	}
	return &Error{Op: op, First: first, Log: logPath, Cause: c, Hint: c.Hint(), Err: err}
}
