package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerPID is the host PID of the container's init (the CRI runtime's
// verbose status).
func (c *criEnv) containerPID(id string) int {
	c.t.Helper()
	s, err := c.rt.ContainerStatus(c.ctx(), &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		c.t.Fatal(err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(s.Info["info"]), &info); err != nil || info.PID <= 0 {
		c.t.Fatalf("container %s: no PID in its verbose status (%v): %.200s", id, err, s.Info["info"])
	}
	return info.PID
}

// podService is the host PID of the service that kcr standby runs in the
// pod whose init has host PID init (kcr standby itself, or the reaper it
// re-executes itself behind): the descendant whose command is cmd.
func podService(t *testing.T, init int, cmd string) int {
	t.Helper()
	var pid int
	eventually(t, 60*time.Second, "the service in the pod", func() (bool, string) {
		var seen []string
		for _, p := range descendants(init) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
			if strings.TrimSpace(string(comm)) == cmd {
				pid = p
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%d %q", p, strings.TrimSpace(string(comm))))
		}
		return false, fmt.Sprintf("in the pod: %v", seen)
	})
	return pid
}

// descendants lists the host PIDs below pid, breadth first. A process is
// adopted by any thread of its reaper: every thread's children are read.
func descendants(pid int) []int {
	var out []int
	todo := []int{pid}
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p))
		for _, task := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", p, task.Name()))
			for _, f := range strings.Fields(string(b)) {
				c, _ := strconv.Atoi(f)
				out = append(out, c)
				todo = append(todo, c)
			}
		}
	}
	return out
}

// checkPodServiceConfined checks the credentials of the service running
// in the pod: of kcr standby's capabilities it keeps only CAP_SYS_ADMIN
// (bounding set too: it can gain no other; ambient, as engine.RunOptions.Caps
// keeps it), with no_new_privs; its uid is
// logged (root here: CRIU dumps a service of another uid only with
// CAP_SYS_RESOURCE, which this host's kcr lacks).
func checkPodServiceConfined(t *testing.T, kcr, svc int) {
	t.Helper()
	k, s := procStatus(t, kcr), procStatus(t, svc)
	t.Logf("in the pod: its init CapEff %s CapBnd %s; the service CapEff %s CapPrm %s CapBnd %s CapInh %s CapAmb %s NoNewPrivs %s Uid %s Seccomp %s",
		k["CapEff"], k["CapBnd"], s["CapEff"], s["CapPrm"], s["CapBnd"], s["CapInh"], s["CapAmb"], s["NoNewPrivs"], s["Uid"], s["Seccomp"])
	const sysAdmin = "0000000000200000"
	for f, want := range map[string]string{"CapEff": sysAdmin, "CapPrm": sysAdmin, "CapBnd": sysAdmin, "CapInh": sysAdmin, "CapAmb": sysAdmin, "NoNewPrivs": "1"} {
		if s[f] != want {
			t.Errorf("the service in the pod (PID %d): %s = %s, want %s", svc, f, s[f], want)
		}
	}
	if k["CapEff"] == s["CapEff"] {
		t.Errorf("the service has the capabilities of the pod's init (%s)", k["CapEff"])
	}
}

// podWakeCycles wakes the pod's service n times by hand (kcr standby wake)
// and lets it sleep again after each; it returns how long they took.
func podWakeCycles(t *testing.T, p *standbyPod, n int) time.Duration {
	t.Helper()
	t0 := time.Now()
	for i := range n {
		p.waitState("standby", 90*time.Second)
		if out, err := (kcrOpts{}).cmd("standby", "wake", "--image-dir", p.dir).CombinedOutput(); err != nil {
			t.Fatalf("cycle %d: kcr standby wake: %v\n%s", i, err, out)
		}
		p.waitState("running", 90*time.Second)
	}
	p.waitState("standby", 90*time.Second)
	return time.Since(t0)
}

// podLogLines counts the lines of the container's log (the CRI format:
// TIME STREAM F|P TEXT) that hold s, and the partial ("P") ones among all.
func podLogLines(t *testing.T, path, s string) (n, partial int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.SplitN(l, " ", 4)
		if len(f) < 4 {
			continue
		}
		if f[2] == "P" {
			partial++
		}
		if strings.Contains(f[3], s) {
			n++
		}
	}
	return n, partial
}

// zombieCount counts the zombies among the descendants of pid (the pod's
// init: every orphan of the pod is reparented to it), and the descendants.
func zombieCount(pid int) (zombies, procs int) {
	for _, c := range descendants(pid) {
		procs++
		if st := procStatusMaybe(c); st != nil && strings.HasPrefix(st["State"], "Z") {
			zombies++
		}
	}
	return zombies, procs
}

// checkPodLeastPrivileged runs in the pod of deploy/kubelet's manifest,
// its service asleep: a wake, the service's credentials checked while it
// runs, then cycles more wakes (KCR_KUBELET_CYCLES, default 10), after
// which no zombie is left in the pod, and every restored copy's
// after-restore line ("kcr: after-restore hooks done", which the service
// writes on its stderr) is in the container's log, whole.
func checkPodLeastPrivileged(t *testing.T, c *criEnv, p *standbyPod, restoresBefore int) {
	t.Helper()
	cycles := 10
	if n, err := strconv.Atoi(os.Getenv("KCR_KUBELET_CYCLES")); err == nil && n > 0 {
		cycles = n
	}
	init := c.containerPID(p.ctr.Id)
	if out, err := (kcrOpts{}).cmd("standby", "wake", "--image-dir", p.dir).CombinedOutput(); err != nil {
		t.Fatalf("kcr standby wake: %v\n%s", err, out)
	}
	p.waitState("running", 90*time.Second)
	checkPodServiceConfined(t, init, podService(t, init, "pipeline"))
	p.waitState("standby", 90*time.Second)
	d := podWakeCycles(t, p, cycles)
	t.Logf("%d wake cycles in the pod: %v, %v a cycle", cycles, d.Round(time.Millisecond), (d / time.Duration(cycles)).Round(time.Millisecond))
	var z, procs int
	// The last copy's checkpoint has just reaped it; an orphan's exit may
	// take a moment to reach the pod's init.
	eventually(t, 10*time.Second, "no zombie in the pod", func() (bool, string) {
		z, procs = zombieCount(init)
		return z == 0, fmt.Sprintf("%d zombies among %d processes in the pod", z, procs)
	})
	t.Logf("after %d wake cycles: %d zombies, %d processes below the pod's init", cycles, z, procs)
	restores := restoresBefore + 1 + cycles
	n, partial := podLogLines(t, p.ctr.LogPath, "kcr: after-restore hooks done")
	if n < restores || partial != 0 {
		t.Errorf("the container's log %s: %d after-restore lines of the service (want %d, one per restore), %d partial lines", p.ctr.LogPath, n, restores, partial)
	}
}
