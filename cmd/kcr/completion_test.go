package main

import (
	"os"
	"strings"
	"testing"
)

// TestCompletionDocumented fails when a shell that `kcr completion` offers
// is missing from docs/cli.md's "Shell completion" section: cobra adds the
// command at run time, so the generated command reference does not list it.
func TestCompletionDocumented(t *testing.T) {
	var g globals
	root := newRoot(&g)
	root.InitDefaultCompletionCmd()
	comp, _, err := root.Find([]string{"completion"})
	if err != nil || comp.Name() != "completion" {
		t.Fatalf("kcr has no completion command (%v)", err)
	}
	b, err := os.ReadFile(cliDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Shell completion\n")
	if !ok {
		t.Fatalf("%s has no \"## Shell completion\" section", cliDoc)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	shells := comp.Commands()
	if len(shells) == 0 {
		t.Fatal("kcr completion offers no shell")
	}
	for _, sh := range shells {
		if !strings.Contains(section, "`"+sh.Name()+"`") {
			t.Errorf("%s's shell completion section does not name `%s`, which `kcr completion` offers", cliDoc, sh.Name())
		}
	}
}
