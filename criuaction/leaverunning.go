package criuaction

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// CRIU does not tell its action script whether the tree goes on after the
// dump: in swrk mode (runc, crun) the option comes over CRIU's RPC socket.
// The runtime's command line says it: containerd's runc shim (the kubelet's
// checkpoint API, which always leaves the container running), CRI-O,
// Podman and "kcr checkpoint --container --leave-running" all run
// "runc|crun ... checkpoint ... --leave-running ... ID", whose child is
// CRIU. leaveRunning looks for that command line among CRIU's ancestors.

// maxAncestors bounds the walk up from CRIU: its parent is the runtime,
// the runtime's the shim or the engine.
const maxAncestors = 3

// leaveRunning reports whether one of the first ancestors of criuPID (the
// process that ran the action script) is a runtime's checkpoint command
// with --leave-running. procRoot is "/proc" but in tests.
func leaveRunning(procRoot string, criuPID int) bool {
	pid := criuPID
	for range maxAncestors {
		ppid := parentPID(procRoot, pid)
		if ppid <= 1 {
			return false
		}
		pid = ppid
		b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
		if err != nil {
			return false
		}
		if checkpointLeavesRunning(strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")) {
			return true
		}
	}
	return false
}

// checkpointLeavesRunning: argv is a checkpoint command (a "checkpoint"
// argument) with --leave-running after it.
func checkpointLeavesRunning(argv []string) bool {
	seen := false
	for _, a := range argv {
		switch {
		case a == "checkpoint":
			seen = true
		case a == "--":
			return false
		case seen && (a == "--leave-running" || a == "--leave-running=true"):
			return true
		}
	}
	return false
}

// parentPID reads the parent of pid, 0 if it cannot.
func parentPID(procRoot string, pid int) int {
	st, err := procfs.ReadStatPath(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	return st.PPID
}
