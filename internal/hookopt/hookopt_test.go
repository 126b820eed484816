package hookopt

import (
	"log/slog"
	"testing"

	"github.com/kcr-dev/kcr/notify"
)

type opt interface{ apply(*[]int) }

type add int

func (a add) apply(c *[]int) { *c = append(*c, int(a)) }

func TestApplySkipsNil(t *testing.T) {
	var got []int
	Apply(&got, []opt{add(1), nil, add(2)}, opt.apply)
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("got %v, want [1 2]", got)
	}
}

func TestDefaults(t *testing.T) {
	r, l := Defaults(nil, nil)
	if r != notify.Default || l != slog.Default() {
		t.Fatalf("Defaults(nil, nil) = %p, %p", r, l)
	}
	myR, myL := notify.NewRegistry(), slog.New(slog.DiscardHandler)
	if r, l := Defaults(myR, myL); r != myR || l != myL {
		t.Fatal("Defaults replaced given values")
	}
}
