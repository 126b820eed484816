package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kcr-dev/kcr/criu"
)

func TestBindRace(t *testing.T) {
	for _, c := range []struct {
		cause criu.Cause
		want  bool
	}{
		{criu.CauseUnixBindInUse, true},
		{criu.CauseFileVanished, true},
		{criu.CauseTCPEstablished, false},
		{criu.CausePIDInUse, false},
		{criu.CauseUnknown, false},
	} {
		err := fmt.Errorf("clone 2: %w", &criu.Error{Op: "restore", Cause: c.cause})
		if got := bindRace(err); got != c.want {
			t.Errorf("bindRace(%s) = %v, want %v", c.cause, got, c.want)
		}
	}
	if bindRace(errors.New("Address already in use")) {
		t.Error("a plain error is not a CRIU bind race")
	}
}
