package client

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// peerClient is the helper that checkpoints and resumes KCR_HELPER_PID
// through its socket KCR_HELPER_PATH, as kcr's action script does; it runs
// inside the target's PID namespace with the host's /proc, as CRIU runs its
// scripts when it restores into a pod's shared PID namespace.
func peerClient() error {
	pid, err := strconv.Atoi(os.Getenv("KCR_HELPER_PID"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := &Socket{PID: pid, Path: os.Getenv("KCR_HELPER_PATH")}
	if _, err := s.Checkpoint(ctx, CheckpointRequest{HookBudget: time.Second, ResumeAfter: 5 * time.Second}); err != nil {
		return err
	}
	if _, err := s.Resume(ctx, "test", time.Second); err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}

// TestPeerInChildPIDNamespace: a client in the app's PID namespace, with
// /proc of the parent namespace, gets the app's PID in its own namespace
// from SO_PEERCRED (1 here) and must map it to /proc's to accept the
// socket. It refused it before ("served by PID 1"): containerd's CRI
// restore into a pod's shared PID namespace ran kcr's post-resume hook so.
func TestPeerInChildPIDNamespace(t *testing.T) {
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Fatal("nsenter (util-linux) is needed")
	}
	e := newSecEnv(t)
	sock, mark := e.victim+"/kcr-v.sock", e.victim+"/hook-ran"
	cmd := e.start("victim", victimUID, []string{"KCR_HELPER_PATH=" + sock, "KCR_HELPER_MARK=" + mark},
		&syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
	pid := cmd.Process.Pid
	c := exec.Command("nsenter", "--target", strconv.Itoa(pid), "--pid", "--", e.bin, "-test.run=^$")
	c.Env = append(os.Environ(), "KCR_CLIENT_HELPER=peer-client", "KCR_HELPER_PID="+strconv.Itoa(pid), "KCR_HELPER_PATH="+sock)
	c.Dir = "/"
	out, err := c.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("checkpoint from inside the app's PID namespace: %v: %s", err, out)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("the app's before-checkpoint hook did not run: %v", err)
	}
}
