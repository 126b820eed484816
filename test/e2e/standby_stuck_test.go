package e2e

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A CRIU that hangs in the middle of a dump (stopped with SIGSTOP once it
// has seized the service) trips the checkpoint's deadline (--stuck-after):
// the probes report the checkpoint stuck meanwhile (/healthz 503), kcr
// standby kills the CRIU that does not end (criu.KillGrace), the service
// is not left frozen (it runs on or is gone, never stopped), kcr standby
// supervises it again and /healthz is 200 again.
func TestStandbyStuckDump(t *testing.T) {
	need(t)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := probe.Addr().String()
	probe.Close()
	k := &kafkaEnv{t: t}
	dir := filepath.Join(t.TempDir(), "img")
	s := k.startStandbyNoKafka(dir, []string{"--idle", "2s", "--stuck-after", "3s", "--metrics", metrics}, appBin, "-heap-mb", "64")
	st := s.waitState("running", 60*time.Second)
	pid := st.PID
	// CRIU seizes the service (its TracerPid) during the dump: stop CRIU
	// there.
	var criuPID int
	eventually(t, 60*time.Second, "CRIU seizing the service", func() (bool, string) {
		criuPID = tracerPID(pid)
		return criuPID > 0, "not yet"
	})
	if err := syscall.Kill(criuPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(criuPID, syscall.SIGKILL) // if the test fails before kcr does
	healthz := func() (int, string) {
		c := http.Client{Timeout: 5 * time.Second}
		r, err := c.Get("http://" + metrics + "/healthz")
		if err != nil {
			return 0, err.Error()
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	eventually(t, 30*time.Second, "/healthz reporting the stuck checkpoint", func() (bool, string) {
		code, body := healthz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "stuck"), body
	})
	// The deadline fires, and CRIU, which cannot abort, is killed.
	eventually(t, 60*time.Second, "kcr standby killing the stopped CRIU", func() (bool, string) {
		f := procStatusMaybe(criuPID)
		return f == nil || strings.HasPrefix(f["State"], "Z"), f["State"]
	})
	// Never frozen: the service runs on (not stopped, not traced) or is
	// gone, and kcr standby supervises one again.
	eventually(t, 30*time.Second, "the service not frozen", func() (bool, string) {
		f := procStatusMaybe(pid)
		return f == nil || (f["TracerPid"] == "0" && !strings.HasPrefix(f["State"], "t") && !strings.HasPrefix(f["State"], "T")), f["State"]
	})
	if procStatusMaybe(pid) != nil {
		t.Logf("the service (PID %d) ran on after CRIU was killed", pid)
	} else {
		t.Logf("the service (PID %d) died with CRIU's parasite in it; kcr standby restarts it", pid)
	}
	s.waitState("running", 60*time.Second)
	eventually(t, 30*time.Second, "/healthz ok again", func() (bool, string) {
		code, body := healthz()
		return code == http.StatusOK, body
	})
	if n := s.countLogs("standby: checkpoint refused or failed; the service resumed and runs on") + s.countLogs("standby: checkpoint failed and the service is gone"); n == 0 {
		t.Errorf("no failed checkpoint logged")
	}
}

// procStatusMaybe is procStatus, nil once the process is gone.
func procStatusMaybe(pid int) map[string]string {
	b, err := readProcStatus(pid)
	if err != nil {
		return nil
	}
	f := map[string]string{}
	for _, l := range strings.Split(b, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			f[k] = strings.TrimSpace(v)
		}
	}
	return f
}

func readProcStatus(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	return string(b), err
}
