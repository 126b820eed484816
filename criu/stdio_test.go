package criu

import (
	"reflect"
	"testing"
)

// testdata/stdio-pipe is CRIU 4.2's dump of "sleep" with stdout and stderr
// on one pipe (pipe:[3186572]) whose reader was not dumped, stdin /dev/null.
func TestStdioPipes(t *testing.T) {
	got, err := StdioPipes("testdata/stdio-pipe")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{1: "pipe:[3186572]", 2: "pipe:[3186572]"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("StdioPipes = %v, want %v", got, want)
	}
	// An image whose stdio is no pipe has none (testdata/images: no
	// ids or fdinfo image, so an error, not a guess).
	if got, err := StdioPipes("testdata/images"); err == nil {
		t.Fatalf("StdioPipes of an image without ids-PID.img = %v, want an error", got)
	}
}
