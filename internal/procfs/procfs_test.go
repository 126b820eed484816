package procfs

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	tail := " 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 99 23\n"
	st, err := ParseStat([]byte("12 (a) b (c)) Z" + tail))
	if err != nil {
		t.Fatal(err)
	}
	if st.Comm != "a) b (c)" || st.PPID != 4 || st.StartTime != 99 || !st.Zombie() {
		t.Errorf("%+v", st)
	}
	if _, err := ParseStat([]byte("12 (a) S 4")); err == nil {
		t.Error("short stat parsed")
	}
	self, err := ReadStatPath("/proc/self/stat")
	if err != nil || self.PPID != os.Getppid() || self.Zombie() {
		t.Errorf("/proc/self/stat: %+v, %v", self, err)
	}
}

func TestParseStatus(t *testing.T) {
	st, err := ParseStatus([]byte("Name:\tsvc x\nTgid:\t42\nUid:\t1000\t1001\t1002\t1003\nNSpid:\t4242\t1\nVmRSS:\t   2048 kB\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Tgid != 42 || st.UIDs != [4]uint32{1000, 1001, 1002, 1003} || !st.OwnPIDNamespace() || st.RSSBytes != 2<<20 {
		t.Errorf("%+v", st)
	}
	// A kernel thread: no VmRSS, one PID namespace.
	st, err = ParseStatus([]byte("Tgid:\t2\nUid:\t0\t0\t0\t0\nNSpid:\t2\n"))
	if err != nil || st.RSSBytes != 0 || st.OwnPIDNamespace() {
		t.Errorf("kernel thread: %+v, %v", st, err)
	}
	for _, bad := range []string{"Tgid:\t2\n", "Uid:\t0\t0\n", "Uid:\t0\t0\t0\t0\nNSpid:\tx\n", "Uid:\t0\t0\t0\t0\nVmRSS:\t12\n"} {
		if _, err := ParseStatus([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	self, err := ReadStatus(os.Getpid())
	if err != nil || self.Tgid != os.Getpid() || self.UIDs[0] != uint32(os.Getuid()) || self.RSSBytes == 0 {
		t.Errorf("own status: %+v, %v", self, err)
	}
}
