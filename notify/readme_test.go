package notify_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// exampleFiles hold the Examples whose code the README and docs/ show.
var exampleFiles = []string{"example_test.go", "../kafkahooks/example_test.go",
	"../kafkahooks/kgohooks/example_test.go", "../kafkahooks/kgohooks/example_service_test.go"}

// TestREADMESnippetsAreExamples keeps the Go snippets of the README and of
// docs/*.md compiling: each, without its imports, must be a run of lines of
// an Example's body.
func TestREADMESnippetsAreExamples(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	var bodies [][]string
	for _, f := range exampleFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			lines = append(lines, strings.TrimPrefix(l, "\t")) // an Example's body is one tab in
		}
		bodies = append(bodies, lines)
	}
	if n := len(goSnippets(string(readme))); n < 2 {
		t.Fatalf("README has %d Go snippets, want the notify and kafkahooks ones", n)
	}
	for _, f := range append([]string{"../README.md"}, docs...) {
		md, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range goSnippets(string(md)) {
			if !slices.ContainsFunc(bodies, func(b []string) bool { return containsRun(b, sn) }) {
				t.Errorf("%s: snippet is in no Example of %s (copy the Example's code):\n%s",
					f, strings.Join(exampleFiles, ", "), strings.Join(sn, "\n"))
			}
		}
	}
}

// goSnippets returns the README's ```go blocks without their import
// declarations and surrounding blank lines.
func goSnippets(md string) [][]string {
	var out [][]string
	for _, part := range strings.Split(md, "```go\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		var lines []string
		inImport := false
		for _, l := range strings.Split(block, "\n") {
			switch {
			case inImport:
				inImport = l != ")"
			case l == "import (":
				inImport = true
			case strings.HasPrefix(l, "import "):
			default:
				lines = append(lines, l)
			}
		}
		for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
			lines = lines[1:]
		}
		for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
			lines = lines[:len(lines)-1]
		}
		out = append(out, lines)
	}
	return out
}

// containsRun reports whether run occurs in lines as consecutive lines.
func containsRun(lines, run []string) bool {
	for i := 0; i+len(run) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(run)], run) {
			return true
		}
	}
	return false
}
