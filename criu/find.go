package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// EnvCRIU names the environment variable that points kcr at a CRIU binary.
const EnvCRIU = "KCR_CRIU"

// ErrNotFound is wrapped by Find when no CRIU binary can be located.
var ErrNotFound = errors.New("criu not found")

// fallbackDirs are searched, in order, when criu is not on $PATH (sudo and
// service managers often run with a short PATH lacking the sbin dirs).
var fallbackDirs = []string{"/usr/local/sbin", "/usr/sbin", "/opt/kcr/criu/bin"}

// Find locates the CRIU binary: explicit (from --criu) if non-empty, else
// $KCR_CRIU, else "criu" on $PATH, else /usr/local/sbin, /usr/sbin and
// /opt/kcr/criu/bin. An explicit path or $KCR_CRIU that is not an executable
// file is an error (it is not silently skipped). The result is absolute.
func Find(explicit string) (string, error) {
	if explicit != "" {
		return checkExecutable(explicit, "--criu")
	}
	if env := os.Getenv(EnvCRIU); env != "" {
		return checkExecutable(env, EnvCRIU)
	}
	if p, err := exec.LookPath("criu"); err == nil {
		return filepath.Abs(p)
	}
	for _, dir := range fallbackDirs {
		p := filepath.Join(dir, "criu")
		if isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: install it with scripts/install-criu.sh, or pass --criu PATH / set %s", ErrNotFound, EnvCRIU)
}

func checkExecutable(p, source string) (string, error) {
	if !strings.Contains(p, "/") {
		lp, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("%w: %s=%q is not on $PATH: install CRIU with scripts/install-criu.sh", ErrNotFound, source, p)
		}
		p = lp
	}
	if !isExecutable(p) {
		return "", fmt.Errorf("%w: %s=%q is not an executable file: install CRIU with scripts/install-criu.sh", ErrNotFound, source, p)
	}
	return filepath.Abs(p)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// Version is a CRIU release number.
type Version struct {
	Major, Minor, Sublevel int
	// GitID is the "GitID:" line of criu --version, if any (development builds).
	GitID string
}

// String formats v as "4.2" or "4.2.1".
func (v Version) String() string {
	if v.Sublevel != 0 {
		return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Sublevel)
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// AtLeast reports whether v >= major.minor.sublevel.
func (v Version) AtLeast(major, minor, sublevel int) bool {
	if v.Major != major {
		return v.Major > major
	}
	if v.Minor != minor {
		return v.Minor > minor
	}
	return v.Sublevel >= sublevel
}

// ParseVersion parses the output of "criu --version":
//
//	Version: 4.2.1
//	GitID: v4.2-12-gdeadbeef
func ParseVersion(out string) (Version, error) {
	var v Version
	found := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "Version:"); ok {
			nums, err := parseDotted(strings.TrimSpace(rest), 3)
			if err != nil || len(nums) < 2 {
				return Version{}, fmt.Errorf("criu: cannot parse version line %q", line)
			}
			v.Major, v.Minor = nums[0], nums[1]
			if len(nums) > 2 {
				v.Sublevel = nums[2]
			}
			found = true
		} else if rest, ok := strings.CutPrefix(line, "GitID:"); ok {
			v.GitID = strings.TrimSpace(rest)
		}
	}
	if !found {
		return Version{}, fmt.Errorf("criu: no \"Version:\" line in %q", strings.TrimSpace(out))
	}
	return v, nil
}

// parseDotted parses up to max leading dot-separated integers of s ("6.18.44-fc"
// gives 6, 18, 44; "4.2" gives 4, 2).
func parseDotted(s string, max int) ([]int, error) {
	var nums []int
	for _, part := range strings.SplitN(s, ".", max) {
		end := 0
		for end < len(part) && part[end] >= '0' && part[end] <= '9' {
			end++
		}
		if end == 0 {
			break
		}
		n, err := strconv.Atoi(part[:end])
		if err != nil {
			return nil, err
		}
		nums = append(nums, n)
		if end < len(part) {
			break
		}
	}
	if len(nums) == 0 {
		return nil, fmt.Errorf("no version number in %q", s)
	}
	return nums, nil
}

// ReadVersion runs "criu --version" and parses it.
func ReadVersion(ctx context.Context, criuPath string) (Version, error) {
	out, err := exec.CommandContext(ctx, criuPath, "--version").CombinedOutput()
	if err != nil {
		return Version{}, fmt.Errorf("criu --version: %w: %s", err, bytes.TrimSpace(out))
	}
	return ParseVersion(string(out))
}

// KernelRelease returns the running kernel's release (uname -r).
func KernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// kernelRule says: on kernels >= Kernel, CRIU older than CRIU breaks.
type kernelRule struct {
	kernelMajor, kernelMinor int
	criu                     Version
	breaks                   string
}

var kernelRules = []kernelRule{
	{6, 16, Version{Major: 4, Minor: 2}, "no TCP socket can be dumped (\"Can't get 1:16 opt: Operation not supported\")"},
	{6, 13, Version{Major: 4, Minor: 0}, "the vDSO layout changed and every dump/restore fails"},
}

// CheckKernel reports whether CRIU v works on the kernel with the given
// release string (as from KernelRelease). Known rules: kernels >= 6.13 need
// CRIU >= 4.0 (vDSO layout change), kernels >= 6.16 need CRIU >= 4.2 (TCP
// socket options). It returns nil when no rule is violated.
func CheckKernel(v Version, kernelRelease string) error {
	k, err := parseDotted(kernelRelease, 3)
	if err != nil || len(k) < 2 {
		return fmt.Errorf("criu: cannot parse kernel release %q", kernelRelease)
	}
	var need Version
	var breaks []string
	for _, r := range kernelRules {
		if k[0] < r.kernelMajor || (k[0] == r.kernelMajor && k[1] < r.kernelMinor) {
			continue
		}
		if !v.AtLeast(r.criu.Major, r.criu.Minor, r.criu.Sublevel) {
			breaks = append(breaks, fmt.Sprintf("below %s %s", r.criu, r.breaks))
			if !need.AtLeast(r.criu.Major, r.criu.Minor, r.criu.Sublevel) {
				need = r.criu
			}
		}
	}
	if len(breaks) == 0 {
		return nil
	}
	return fmt.Errorf("CRIU %s is too old for kernel %s: with CRIU %s; install CRIU >= %s with scripts/install-criu.sh",
		v, kernelRelease, strings.Join(breaks, ", and "), need)
}

// Check runs "criu check" (for kcr doctor) and returns its combined output.
// A non-zero exit is returned as an error along with the output.
func Check(ctx context.Context, criuPath string) (string, error) {
	out, err := exec.CommandContext(ctx, criuPath, "check").CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("criu check: %w", err)
	}
	return string(out), nil
}
