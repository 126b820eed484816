package engine

import (
	"errors"
	"testing"

	"github.com/kcr-dev/kcr/criu"
)

func TestBindRace(t *testing.T) {
	sock := "/proc/7/root/run/kcr/kcr-7.sock"
	for _, c := range []struct {
		first string
		want  bool
	}{
		{"unix: Can't bind id 0xb ino 198309 addr /run/kcr/kcr-7.sock: Address already in use", true},
		{"Unable to change [-100]//run/kcr/kcr-7.sock ownership to (0, 0): No such file or directory", true},
		{"inet: Connected TCP socket, consider using --tcp-established option.", false},
		{"Can't fork for 20923: File exists", false},
	} {
		if got := bindRace(&criu.Error{Op: "restore", First: c.first}, sock); got != c.want {
			t.Errorf("bindRace(%q) = %v, want %v", c.first, got, c.want)
		}
	}
	if bindRace(errors.New("Address already in use"), sock) {
		t.Error("a plain error is not a CRIU bind race")
	}
}
