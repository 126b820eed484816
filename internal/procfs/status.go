package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Status holds the fields of /proc/<pid>/status kcr uses.
type Status struct {
	Tgid int // the thread group (process) a task belongs to
	// UIDs are the real, effective, saved and filesystem uids.
	UIDs [4]uint32
	// NSpid is the PID in each PID namespace the process is in, the
	// outermost (the reader's /proc) first.
	NSpid    []int
	RSSBytes int64 // VmRSS; 0 for kernel threads and zombies
}

// OwnPIDNamespace reports whether the process is init (PID 1) of a PID
// namespace nested in the outermost one, as under "kcr run".
func (s *Status) OwnPIDNamespace() bool {
	return len(s.NSpid) >= 2 && s.NSpid[len(s.NSpid)-1] == 1
}

// ReadStatus reads /proc/<pid>/status.
func ReadStatus(pid int) (*Status, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	return ParseStatus(b)
}

// ParseStatus parses the content of a /proc/<pid>/status file. Its Uid
// line must be there; a field kcr reads that is malformed is an error.
func ParseStatus(b []byte) (*Status, error) {
	s := &Status{}
	uid := false
	for _, line := range strings.Split(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		var err error
		switch key {
		case "Tgid":
			s.Tgid, err = oneInt(f)
		case "Uid":
			if len(f) != 4 {
				err = fmt.Errorf("want 4 uids")
			}
			for i := 0; err == nil && i < len(f); i++ {
				var u uint64
				u, err = strconv.ParseUint(f[i], 10, 32)
				s.UIDs[i] = uint32(u)
			}
			uid = true
		case "NSpid":
			s.NSpid = make([]int, len(f))
			for i := 0; err == nil && i < len(f); i++ {
				s.NSpid[i], err = strconv.Atoi(f[i])
			}
		case "VmRSS":
			if len(f) != 2 || f[1] != "kB" {
				err = fmt.Errorf("want a size in kB")
				break
			}
			s.RSSBytes, err = strconv.ParseInt(f[0], 10, 64)
			s.RSSBytes *= 1024
		}
		if err != nil {
			return nil, fmt.Errorf("malformed /proc status line %q: %v", line, err)
		}
	}
	if !uid {
		return nil, fmt.Errorf("no Uid line in /proc status")
	}
	return s, nil
}

func oneInt(f []string) (int, error) {
	if len(f) != 1 {
		return 0, fmt.Errorf("want one number")
	}
	return strconv.Atoi(f[0])
}
