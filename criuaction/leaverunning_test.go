package criuaction

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestCheckpointLeavesRunning(t *testing.T) {
	for _, c := range []struct {
		argv string
		want bool
	}{
		// containerd's runc shim (go-runc) for the kubelet's checkpoint API.
		{"runc --root /run/containerd/runc/k8s.io --log log.json --log-format json checkpoint --image-path /x --work-path /y --leave-running abc", true},
		{"crun checkpoint --leave-running=true abc", true},
		{"runc checkpoint --image-path /x abc", false},
		{"runc --leave-running run abc", false}, // not a checkpoint
		{"runc checkpoint -- --leave-running", false},
		{"kcr standby -- runc checkpoint --leave-running x", false},
	} {
		if got := checkpointLeavesRunning(strings.Fields(c.argv)); got != c.want {
			t.Errorf("checkpointLeavesRunning(%q) = %v, want %v", c.argv, got, c.want)
		}
	}
}

// fakeProcChain writes stat and cmdline files for a chain of processes: pids[i]'s
// parent is pids[i+1].
func fakeProcChain(t *testing.T, pids []int, cmdlines []string) string {
	root := t.TempDir()
	for i, pid := range pids {
		ppid := 1
		if i+1 < len(pids) {
			ppid = pids[i+1]
		}
		d := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(pid) + " (a b) c) S " + strconv.Itoa(ppid) + " 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0"
		cmd := strings.ReplaceAll(cmdlines[i], " ", "\x00") + "\x00"
		if os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o600) != nil || os.WriteFile(filepath.Join(d, "cmdline"), []byte(cmd), 0o600) != nil {
			t.Fatal("cannot write the fake /proc")
		}
	}
	return root
}

func TestLeaveRunningAncestors(t *testing.T) {
	// CRIU (swrk) under runc under the shim.
	root := fakeProcChain(t, []int{40, 30, 20}, []string{"criu swrk 3", "runc checkpoint --leave-running ctr", "containerd-shim-runc-v2 -id x"})
	if !leaveRunning(root, 40) {
		t.Error("runc checkpoint --leave-running as CRIU's parent: want leave-running")
	}
	root = fakeProcChain(t, []int{40, 30, 20}, []string{"criu swrk 3", "runc checkpoint ctr", "containerd-shim-runc-v2 -id x"})
	if leaveRunning(root, 40) {
		t.Error("runc checkpoint without --leave-running: want no leave-running")
	}
	// Too far up: not the runtime that runs this CRIU.
	root = fakeProcChain(t, []int{50, 40, 30, 20, 10}, []string{"criu swrk 3", "a", "b", "c", "runc checkpoint --leave-running ctr"})
	if leaveRunning(root, 50) {
		t.Error("a --leave-running command line four levels up: want no leave-running")
	}
}
