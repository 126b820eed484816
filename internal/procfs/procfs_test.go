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
