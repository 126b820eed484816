package criuaction

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// containerd pauses a task (freezes its cgroup) before it checkpoints it:
// its client's Container.Checkpoint, which the CRI plugin's
// CheckpointContainer (the kubelet's checkpoint API) uses, runs Pause, then
// runc checkpoint, then Resume. A frozen app cannot run its hooks, so
// pre-dump thaws the cgroup for the hooks and freezes it again before CRIU
// goes on: the dump still sees the tree as containerd left it.

// freezer is the freezer of one cgroup: cgroup v1's freezer.state or
// cgroup v2's cgroup.freeze.
type freezer struct {
	file string // freezer.state (v1) or cgroup.freeze (v2)
	v2   bool
}

// findFreezer returns the freezer of pid's cgroup, from /proc/PID/cgroup
// and this process's mountinfo (procRoot is "/proc" but in tests). A v1
// freezer hierarchy wins over v2, as it does for runc on a hybrid host.
func findFreezer(procRoot string, pid int) (*freezer, error) {
	cg, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, err
	}
	mi, err := os.ReadFile(filepath.Join(procRoot, "self", "mountinfo"))
	if err != nil {
		return nil, err
	}
	var v1Path, v2Path string
	haveV2 := false
	for _, l := range strings.Split(string(cg), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2Path, haveV2 = f[2], true
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "freezer" {
				v1Path = f[2]
			}
		}
	}
	var v1Mount, v2Mount string
	sc := bufio.NewScanner(strings.NewReader(string(mi)))
	for sc.Scan() {
		// ID parent major:minor root mountpoint opts ... - fstype source superopts
		left, right, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 || lf[3] != "/" {
			continue
		}
		switch rf[0] {
		case "cgroup":
			for _, o := range strings.Split(rf[2], ",") {
				if o == "freezer" && v1Mount == "" {
					v1Mount = lf[4]
				}
			}
		case "cgroup2":
			if v2Mount == "" {
				v2Mount = lf[4]
			}
		}
	}
	join := func(mount, p string) (string, error) {
		full := filepath.Join(mount, filepath.Clean("/"+p))
		if !strings.HasPrefix(full, filepath.Clean(mount)+"/") && full != filepath.Clean(mount) {
			return "", fmt.Errorf("cgroup path %q leaves %s", p, mount)
		}
		return full, nil
	}
	switch {
	case v1Path != "" && v1Mount != "":
		d, err := join(v1Mount, v1Path)
		if err != nil {
			return nil, err
		}
		return &freezer{file: filepath.Join(d, "freezer.state")}, nil
	case haveV2 && v2Mount != "":
		d, err := join(v2Mount, v2Path)
		if err != nil {
			return nil, err
		}
		return &freezer{file: filepath.Join(d, "cgroup.freeze"), v2: true}, nil
	}
	return nil, nil
}

// frozen says whether the cgroup is frozen or freezing.
func (f *freezer) frozen() (bool, error) {
	b, err := os.ReadFile(f.file)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // a root cgroup has no freezer file: never frozen
	}
	if err != nil {
		return false, err
	}
	s := strings.TrimSpace(string(b))
	if f.v2 {
		return s == "1", nil
	}
	return s == "FROZEN" || s == "FREEZING", nil
}

func (f *freezer) set(frozen bool) error {
	v := map[bool]string{true: "FROZEN", false: "THAWED"}[frozen]
	if f.v2 {
		v = map[bool]string{true: "1", false: "0"}[frozen]
	}
	// O_WRONLY without O_CREATE: a cgroup file, never a new one.
	fd, err := os.OpenFile(f.file, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fd.WriteString(v)
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	return err
}

// thawForHooks thaws the cgroup of pid if it is frozen, and returns what
// freezes it again (waiting up to wait for it to be frozen); nil if it was
// not frozen or has no freezer.
func thawForHooks(procRoot string, pid int, wait time.Duration) (refreeze func() error, err error) {
	f, err := findFreezer(procRoot, pid)
	if err != nil || f == nil {
		return nil, err
	}
	fr, err := f.frozen()
	if err != nil || !fr {
		return nil, err
	}
	if err := f.set(false); err != nil {
		return nil, fmt.Errorf("thaw %s for the hooks: %w", f.file, err)
	}
	return func() error {
		if err := f.set(true); err != nil {
			return fmt.Errorf("freeze %s again after the hooks: %w", f.file, err)
		}
		for end := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
			b, err := os.ReadFile(f.file)
			if err == nil && (f.v2 || strings.TrimSpace(string(b)) == "FROZEN") {
				return nil
			}
			if time.Now().After(end) {
				return fmt.Errorf("%s is %q %v after freezing it again", f.file, strings.TrimSpace(string(b)), wait)
			}
		}
	}, nil
}
