package e2e

// kcr standby runs its service least-privileged: as the user it names,
// with the capabilities it names (none by default) and no_new_privs, in
// every copy it restores; and the service cannot read kcr's secrets.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procStatus reads the fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	f := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

// checkConfined checks the credentials of the service's process pid.
func checkConfined(t *testing.T, what string, pid int, want map[string]string) {
	t.Helper()
	got := procStatus(t, pid)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s (PID %d): %s = %q, want %q", what, pid, k, got[k], v)
		}
	}
}

func TestStandbyServiceUnprivileged(t *testing.T) {
	need(t)
	const secret = "kcr-e2e-sasl-secret-0f3c"
	t.Setenv("KCR_KAFKA_SASL_PASSWORD", secret)
	k := &kafkaEnv{t: t}
	dir := filepath.Join(t.TempDir(), "img")
	// NET_BIND_SERVICE (bit 10), as asked, and SYS_ADMIN (bit 21), which
	// CRIU's dump needs inside the service's PID namespace.
	caps := "0000000000200400"
	s := k.startStandbyNoKafka(dir, []string{"--idle", "1h", "--user", "0:0", "--user-groups", "65532", "--caps", "NET_BIND_SERVICE"}, appBin)
	st := s.waitState("running", 60*time.Second)
	want := map[string]string{
		"Uid": "0\t0\t0\t0", "Groups": "65532",
		"CapInh": caps, "CapPrm": caps, "CapEff": caps, "CapBnd": caps, "CapAmb": caps, "NoNewPrivs": "1",
	}
	checkConfined(t, "cold start", st.PID, want)
	for _, pid := range []int{s.cmd.Process.Pid, st.PID} {
		env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(env), secret) {
			t.Errorf("/proc/%d/environ holds $KCR_KAFKA_SASL_PASSWORD's value", pid)
		}
	}

	for cycle := 1; cycle <= 2; cycle++ {
		if out, err := (kcrOpts{}).cmd("standby", "sleep", "--image-dir", dir).CombinedOutput(); err != nil {
			t.Fatalf("standby sleep: %v: %s", err, out)
		}
		s.waitState("standby", 60*time.Second)
		if out, err := (kcrOpts{}).cmd("standby", "wake", "--image-dir", dir).CombinedOutput(); err != nil {
			t.Fatalf("standby wake: %v: %s", err, out)
		}
		st = s.waitState("running", 60*time.Second)
		checkConfined(t, "restored copy "+strconv.Itoa(cycle), st.PID, want)
	}
}
