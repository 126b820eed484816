package archcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// userDocs are the Markdown pages users read: the README, CONTRIBUTING and
// every page under docs/.
func userDocs(t *testing.T, root string) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "CONTRIBUTING.md"))
	return pages
}

// history matches what a page would say about how it came to be, in
// headings and prose alike: an issue or a review round by number, a run of
// a lab notebook ("Run 7", "runs 3–5"), a fix told as a story ("before
// this", "without the fix", "we changed"), what kcr used to do ("used to",
// "previously", "until now"), findings on the way, a "what
// changed" section. Git and CHANGELOG.md keep that; a page says what is.
var history = regexp.MustCompile(`(?i)\bissues? #?[0-9]|\b(review )?rounds? [0-9]|\breview round|` +
	`\bruns? [0-9]+(–[0-9]+)?\b(:|'s| found| failed| passed| on commit)|^#+ .*\bruns? [0-9]|` +
	`\bbefore (this|the fix|that fix|commit)\b|\b(with|without|after|since|until) (the|this|that) (fix|change)\b|` +
	`\bwe (changed|added|removed|fixed|found|replaced|moved|tried|rewrote|switched|now)\b|` +
	`\bused to\b|\bpreviously\b|\buntil now\b|\bas of this writing\b|\bnot known yet\b|` +
	`\bfindings on the way\b|\bwhat was run here\b|^#+ .*(what changed|history\b)`)

// commitStory is a commit named outside the benchmark pages, which name one
// for every figure: elsewhere a commit tells when something changed.
var commitStory = regexp.MustCompile(`(?i)\bcommits? [0-9a-f]{7,40}\b|\([0-9a-f]{7,40}\)`)

// TestDocsSayWhatIs fails for a passage of a user page, in a heading or in
// prose (a paragraph read whole, so a phrase split over lines is found),
// that tells history instead of what is.
func TestDocsSayWhatIs(t *testing.T) {
	root := repoRoot(t)
	for _, page := range userDocs(t, root) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range historyIn(string(b), !isBenchmarkPage(page)) {
			t.Errorf("%s:%d tells history (%q): say what is; the commit message and CHANGELOG.md keep how it came to be", page[len(root)+1:], h.line, h.figure)
		}
	}
}

// historyIn lists the passages of a page that tell history; with commits,
// a named commit counts as one.
func historyIn(page string, commits bool) []figureViolation {
	var out []figureViolation
	for _, blk := range blocks(page) {
		text := linkTarget.ReplaceAllString(codeSpan.ReplaceAllString(blk.text, "``"), "]()")
		// Lines are joined so that a phrase broken over two is read whole.
		joined := strings.ReplaceAll(text, "\n", " ")
		for _, re := range []*regexp.Regexp{history, commitStory} {
			if re == commitStory && !commits {
				continue
			}
			for _, loc := range re.FindAllStringIndex(joined, -1) {
				out = append(out, figureViolation{blk.line + strings.Count(text[:loc[0]], "\n"), joined[loc[0]:loc[1]]})
			}
		}
	}
	return out
}

// link is a Markdown link's target; fenced code is skipped before.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks fails for a relative link of a user page to a file that does
// not exist, or to a heading that a Markdown page does not have, so that
// moving a page or renaming a section cannot leave a link behind.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	headings := map[string]map[string]bool{} // page → anchors
	anchors := func(page string) map[string]bool {
		if h, ok := headings[page]; ok {
			return h
		}
		h := map[string]bool{}
		if b, err := os.ReadFile(page); err == nil {
			for _, line := range prose(string(b)) {
				if title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
					h[anchor(title)] = true
				}
			}
		}
		headings[page] = h
		return h
	}
	for _, page := range userDocs(t, root) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range prose(string(b)) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), file)
				}
				name := page[len(root)+1:]
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links to %s, which does not exist", name, target)
					continue
				}
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(dest)[frag] {
					t.Errorf("%s links to %s, but %s has no heading with that anchor", name, target, filepath.Base(dest))
				}
			}
		}
	}
}

// prose is a page's lines outside fenced code blocks.
func prose(page string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// anchor is the fragment GitHub gives a heading: lower case, punctuation
// other than hyphens and underscores dropped, spaces turned into hyphens.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(title)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestHistoryRule holds the history rule to cases, in prose as in headings.
func TestHistoryRule(t *testing.T) {
	for _, c := range []struct {
		text    string
		commits bool
		want    int
	}{
		{"kcr kills CRIU once the dumped process is gone.", true, 0},
		{"### Run 7: the head after run 6's fixes", false, 1},
		{"The leave is retried. Run 2's failure: CRIU hung.", false, 1},
		{"Before this (commit 2060295), two things went\nwrong.", false, 1},
		{"Before this (commit 2060295), two things went\nwrong.", true, 2},
		{"The hook was slow; we\nfixed it.", false, 1},
		{"Without the\nfix the member waited.", false, 1},
		{"2026-12-06, commit a0c0fd8, `scripts/bench.sh`.", false, 0},
		{"2026-12-06, commit a0c0fd8, `scripts/bench.sh`.", true, 1},
		{"It came out of two reviews (issues 8 and 23).", false, 1},
		{"## What changed", false, 1},
		{"Each run of the soak restarts the broker.", false, 0},
	} {
		if got := len(historyIn(c.text, c.commits)); got != c.want {
			t.Errorf("%q (commits %v): %d passages of history, want %d", c.text, c.commits, got, c.want)
		}
	}
}

// TestDocsIndexComplete fails for a page under docs/ that docs/README.md, the
// index, does not link to: a page nobody can find from the index is lost.
func TestDocsIndexComplete(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, line := range prose(string(b)) {
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			file, _, _ := strings.Cut(m[1], "#")
			linked[filepath.Clean(file)] = true
		}
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if name := filepath.Base(p); name != "README.md" && !linked[name] {
			t.Errorf("docs/README.md does not link to %s: add it to the index, under the part it belongs to", name)
		}
	}
}

// testName is a test named by its function (a Go test, benchmark or fuzz
// target, a pattern of them) or its file.
var testName = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z0-9_*][\w*]*|[\w./-]*_test\.go\b`)

// htmlComment is what a Markdown page holds for its tools (the generated
// sections' markers), not for its reader.
var htmlComment = regexp.MustCompile(`(?s)<!--.*?-->`)

// contributorPages are the pages written for those who change kcr, not for
// its users: they name the tests to run and where to add one.
var contributorPages = map[string]bool{"CONTRIBUTING.md": true, "docs/architecture.md": true}

// TestDocsNameNoTests fails for a user page that names a test, by its
// function or its file: a user page says what kcr does and links to the
// benchmark pages for what was measured; which test holds it is for the
// code and its contributors. A benchmark page may name a test in the
// command that produced a figure (a `go test` code span or code block).
func TestDocsNameNoTests(t *testing.T) {
	root := repoRoot(t)
	for _, page := range userDocs(t, root) {
		name := filepath.ToSlash(page[len(root)+1:])
		if contributorPages[name] {
			continue
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range testNamesIn(string(b), isBenchmarkPage(page)) {
			t.Errorf("%s:%d names a test (%s): say what kcr does; a figure's command belongs in the benchmark pages, the test in the code", name, v.line, v.figure)
		}
	}
}

// testNamesIn lists where a page names a test; with commands, a test named
// in a `go test` command does not count.
func testNamesIn(page string, commands bool) []figureViolation {
	text := htmlComment.ReplaceAllStringFunc(page, blankLines)
	if commands {
		// Spans are paired from the page's first backtick on, as Markdown
		// pairs them, so prose between two spans is never taken for one.
		text = codeSpan.ReplaceAllStringFunc(text, func(span string) string {
			if strings.Contains(span, "go test") {
				return blankLines(span)
			}
			return span
		})
		text = goTestBlocks(text)
	}
	var out []figureViolation
	for _, loc := range testName.FindAllStringIndex(text, -1) {
		out = append(out, figureViolation{1 + strings.Count(text[:loc[0]], "\n"), text[loc[0]:loc[1]]})
	}
	return out
}

// goTestBlocks blanks the code blocks of text, fenced or indented, that
// hold a `go test` command.
func goTestBlocks(text string) string {
	lines := strings.Split(text, "\n")
	blank := func(from, to int) { // lines[from:to]
		if strings.Contains(strings.Join(lines[from:to], "\n"), "go test") {
			for j := from; j < to; j++ {
				lines[j] = ""
			}
		}
	}
	for i := 0; i < len(lines); i++ {
		switch {
		case strings.HasPrefix(strings.TrimSpace(lines[i]), "```"):
			end := i + 1
			for end < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[end]), "```") {
				end++
			}
			blank(i, min(end+1, len(lines)))
			i = end
		case isIndentedCode(lines[i]) && (i == 0 || strings.TrimSpace(lines[i-1]) == ""):
			end := i + 1
			for end < len(lines) && (isIndentedCode(lines[end]) || strings.TrimSpace(lines[end]) == "") {
				end++
			}
			blank(i, end)
			i = end - 1
		}
	}
	return strings.Join(lines, "\n")
}

// isIndentedCode is whether line belongs to an indented code block, if one
// starts there.
func isIndentedCode(line string) bool {
	return (strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t")) && strings.TrimSpace(line) != ""
}

// blankLines is s with its line breaks only, so that lines keep their
// numbers.
func blankLines(s string) string {
	return strings.Repeat("\n", strings.Count(s, "\n"))
}

// TestTestNameRule holds the test-name rule to cases.
func TestTestNameRule(t *testing.T) {
	for _, c := range []struct {
		text     string
		commands bool
		want     int
	}{
		{"kcr restores the group member (`TestKgoKIP848Restore`).", false, 1},
		{"Tested end to end (`test/e2e/kgo_test.go`, `kafka_clone_test.go`).", false, 2},
		{"The hold (`TestStandbyHoldGroup*`) keeps it.", false, 1},
		{"| crash loop | starts cold | `TestCrashLoop` |", false, 1},
		{"Testing a service takes a minute; see the Tests section.", false, 0},
		{"<!-- generated by `go test ./cmd/kcr -run TestCLIDoc -update` -->", false, 0},
		{"2026-12-06, `go test -run TestKgoRestoreFirstRecord ./test/e2e/`", true, 0},
		{"2026-12-06, `go test -run TestKgoRestoreFirstRecord ./test/e2e/`", false, 1},
		{"`KCR_E2E=1 go test -run\n'TestA|TestB' ./test/e2e/`", true, 0},
		{"```\nKCR_E2E=1 go test -run TestKubelet ./test/e2e/\n```", true, 0},
		{"```\nkcr standby -- ./TestApp\n```", true, 1},
		{"In `TestKubeletStandbyPod` the pod woke.", true, 1},
		{"Run `a` then go test it with TestX and `b`.", true, 1},
		{"Measured so:\n\n    KCR_E2E=1 \\\n      go test -run 'TestA$|TestB$' ./test/e2e/\n\nIn TestB the pod woke.", true, 1},
	} {
		if got := len(testNamesIn(c.text, c.commands)); got != c.want {
			t.Errorf("%q (commands %v): %d tests named, want %d", c.text, c.commands, got, c.want)
		}
	}
}
