package engine

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// statusOf runs cat /proc/self/status through Run with o and returns the
// fields it printed.
func statusOf(t *testing.T, o RunOptions) map[string]string {
	t.Helper()
	o.Args = []string{"cat", "/proc/self/status"}
	o.Log = filepath.Join(t.TempDir(), "cat.log")
	if _, err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var b []byte
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(string(b), "\nNoNewPrivs:") || !strings.Contains(string(b), "\nvoluntary_ctxt_switches") {
		if time.Now().After(deadline) {
			t.Fatalf("no status in the log: %q", b)
		}
		time.Sleep(10 * time.Millisecond)
		b, _ = os.ReadFile(o.Log)
	}
	f := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

func wantFields(t *testing.T, what string, got map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got[k], v)
		}
	}
}

// A program Run starts has no capability and no_new_privs unless told
// otherwise, as root or as another uid, and keeps exactly the ones named;
// kcr keeps its own.
func TestRunCapabilities(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("run as root: Run's capability drop is a root kcr's")
	}
	own, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	ownBnd := field(string(own), "CapBnd")
	none := "0000000000000000"
	admin := "0000000000200000" // CAP_SYS_ADMIN, bit 21: CRIU's dump needs it in a PID namespace
	wantFields(t, "default", statusOf(t, RunOptions{}), map[string]string{
		"CapInh": admin, "CapPrm": admin, "CapEff": admin, "CapBnd": admin, "CapAmb": admin, "NoNewPrivs": "1", "Uid": "0\t0\t0\t0",
	})
	wantFields(t, "no PID namespace", statusOf(t, RunOptions{NoPIDNamespace: true}), map[string]string{
		"CapInh": none, "CapPrm": none, "CapEff": none, "CapBnd": none, "CapAmb": none, "NoNewPrivs": "1",
	})
	caps, err := ParseCaps([]string{"net_bind_service", "CAP_NET_BIND_SERVICE"})
	if err != nil {
		t.Fatal(err)
	}
	cred, err := ParseUser("65534:65533", []string{"65532"})
	if err != nil {
		t.Fatal(err)
	}
	nbs := "0000000000000400" // bit 10
	wantFields(t, "--user 65534:65533 --caps NET_BIND_SERVICE", statusOf(t, RunOptions{Cred: cred, Caps: caps, NoPIDNamespace: true}), map[string]string{
		"CapInh": nbs, "CapPrm": nbs, "CapEff": nbs, "CapBnd": nbs, "CapAmb": nbs, "NoNewPrivs": "1",
		"Uid": "65534\t65534\t65534\t65534", "Gid": "65533\t65533\t65533\t65533", "Groups": "65532",
	})
	wantFields(t, "root with NET_BIND_SERVICE", statusOf(t, RunOptions{Caps: caps}), map[string]string{
		"CapPrm": "0000000000200400", "CapEff": "0000000000200400", "CapBnd": "0000000000200400", "NoNewPrivs": "1",
	})
	wantFields(t, "AllCaps", statusOf(t, RunOptions{AllCaps: true}), map[string]string{"CapBnd": ownBnd, "NoNewPrivs": "0"})
	// The programs kcr starts itself (CRIU) keep kcr's privileges,
	// whichever thread starts them: the confined thread ran no Go code
	// after its Run (a locked thread ends, or parks for good if it was
	// the main thread).
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			out, err := exec.Command("cat", "/proc/self/status").Output()
			if err != nil {
				t.Error(err)
				return
			}
			if got := field(string(out), "CapBnd"); got != ownBnd {
				t.Errorf("a program kcr starts after Run: CapBnd %s, want kcr's %s", got, ownBnd)
			}
			if got := field(string(out), "NoNewPrivs"); got != "0" {
				t.Errorf("a program kcr starts after Run: NoNewPrivs %s", got)
			}
		})
	}
	wg.Wait()
}

func field(status, k string) string {
	for _, l := range strings.Split(status, "\n") {
		if kk, v, ok := strings.Cut(l, ":"); ok && kk == k {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestParseCapsAndUser(t *testing.T) {
	if _, err := ParseCaps([]string{"NET_BIND"}); err == nil || !strings.Contains(err.Error(), "capabilities(7)") {
		t.Errorf("unknown capability: %v", err)
	}
	if c, err := ParseCaps([]string{"sys_time", "CAP_CHECKPOINT_RESTORE"}); err != nil || len(c) != 2 || c[0] != 25 || c[1] != 40 {
		t.Errorf("ParseCaps: %v %v", c, err)
	}
	c, err := ParseUser("root", nil)
	if err != nil || c.Uid != 0 || c.Gid != 0 || len(c.Groups) != 0 {
		t.Errorf("ParseUser(root): %+v %v", c, err)
	}
	if _, err := ParseUser("no-such-user-kcr", nil); err == nil || !strings.Contains(err.Error(), "give a uid") {
		t.Errorf("unknown user: %v", err)
	}
	if _, err := ParseUser("1000:no-such-group-kcr", nil); err == nil || !strings.Contains(err.Error(), "give a gid") {
		t.Errorf("unknown group: %v", err)
	}
}

// kcr doctor names each capability a root kcr lacks for checkpoint and
// restore, SYS_TIME among them.
func TestStepCapsCheck(t *testing.T) {
	all := uint64(1)<<21 | 1<<12 | 1<<25 | 1<<18
	if c := stepCapsCheck(all); !c.OK || c.Fix != "" {
		t.Errorf("all four: %+v", c)
	}
	c := stepCapsCheck(all &^ (1 << 25))
	if c.OK || !strings.Contains(c.Detail, "CAP_SYS_TIME") || strings.Contains(c.Detail, "CAP_SYS_ADMIN") || !strings.Contains(c.Fix, "restore fails") {
		t.Errorf("without SYS_TIME: %+v", c)
	}
	if c := stepCapsCheck(0); c.OK || strings.Count(c.Detail, "CAP_") != 4 {
		t.Errorf("none: %+v", c)
	}
}
