package procfs

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

const scrubHelperEnv = "KCR_PROCFS_SCRUB_HELPER"

// The helper process: scrubs KCR_TEST_SECRET, says so on stdout and waits
// for stdin to close.
func TestMain(m *testing.M) {
	if os.Getenv(scrubHelperEnv) == "1" {
		found, err := ScrubSelfEnv("KCR_TEST_SECRET")
		if err != nil || !found {
			os.Stdout.WriteString("error " + strconv.FormatBool(found) + " " + errString(err) + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("scrubbed\n")
		b := make([]byte, 1)
		os.Stdin.Read(b)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A process's secret variable is gone from /proc/<pid>/environ once it
// scrubbed it (os.Unsetenv alone leaves it there), and its other
// variables stay.
func TestScrubSelfEnv(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), scrubHelperEnv+"=1", "KCR_TEST_SECRET=hunter2-secret", "KCR_TEST_OTHER=keep")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	line := make([]byte, 200)
	n, _ := out.Read(line)
	if string(line[:n]) != "scrubbed\n" {
		t.Fatalf("helper: %q", line[:n])
	}
	env, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(env, []byte("hunter2")) {
		t.Errorf("the secret is still in /proc/%d/environ", cmd.Process.Pid)
	}
	if !bytes.Contains(env, []byte("\x00KCR_TEST_OTHER=keep\x00")) {
		t.Errorf("another variable was lost: %q", env)
	}
}

func TestEnvBounds(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	s, e, err := envBounds(b)
	if err != nil || s == 0 || e <= s {
		t.Fatalf("envBounds: %d %d %v", s, e, err)
	}
	if _, _, err := envBounds([]byte("1 (x) S 0")); err == nil {
		t.Error("a short stat: no error")
	}
}
