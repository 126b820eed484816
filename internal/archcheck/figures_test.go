package archcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A measured figure has one home: the benchmark pages (docs/benchmarks*.md),
// with its date, commit and command. Every other page quotes it with a link
// there, or does not quote it.
//
// The rule, precisely. A figure is a number or a range ("28–34 ms") with a
// unit of time, size, rate or share (figure below). In a user page other than the benchmark pages,
// outside fenced code, code spans and link targets, every figure must be
// one of:
//
//   - a quote: its block (a paragraph, a list item or a table row) links to
//     a benchmark page, and the same figure (number and unit, spacing aside)
//     is written in one of the pages it links to, so a quote cannot drift
//     from its home;
//   - a setting: a default, a limit or a configured value, which no run
//     measures. Such a figure has a setting word (settingWord) among the six
//     words before it or the three after it, within its clause (clauses end
//     at . and ;), e.g. "every 25 ms", "30 s by default",
//     "16 MiB at most", "the 30 s session", "(default 10 s)".
//
// A value the user types or the code sets may also be written as code
// (`--idle 60s`, `10s` in a flag table), which the rule does not read.
var figure = regexp.MustCompile(`(?:^|[^\p{L}\p{N}_.\-])(\d+(?:[.,]\d+)*(?:[ \x{00a0}]?[–-][ \x{00a0}]?\d+(?:[.,]\d+)*)?)(?:[ \x{00a0}]?)(ns|µs|us|ms|milliseconds|seconds|minutes|hours|min|h|s|KiB|MiB|GiB|TiB|kB|MB|GB|requests/s|records/s|req/s|%|x faster|× faster)(?:[^\p{L}\p{N}_]|$)`)

// settingWord names what a non-measured figure is: a default, a bound, a
// period, or one of the timers a setting sets. Matched against single words
// and pairs of words.
var settingWord = regexp.MustCompile(`^(default|defaults|by default|at most|up to|at least|every|limit|limits|limited|cap|capped|clamped|bound|bounded|threshold|timeout|session|deadline|interval|delay|budget|backoff|maximum|minimum)$`)

// benchmarkLink is a link to a benchmark page, relative to docs/ or to the root.
var benchmarkLink = regexp.MustCompile(`\]\(((?:docs/)?benchmarks[a-z-]*\.md)(?:#[^)\s]*)?\)`)

// codeSpan and linkTarget are left out before figures are read.
var (
	codeSpan   = regexp.MustCompile("`[^`]*`")
	linkTarget = regexp.MustCompile(`\]\([^)\s]*\)`)
)

// TestFiguresHaveOneHome fails for a measured figure outside the benchmark
// pages that is not a quote of them.
func TestFiguresHaveOneHome(t *testing.T) {
	root := repoRoot(t)
	bench := map[string]string{} // benchmark page (base name) → its figures, normalised
	pages, err := filepath.Glob(filepath.Join(root, "docs", "benchmarks*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no benchmark pages under docs/ (%v)", err)
	}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		bench[filepath.Base(p)] = normalFigures(string(b))
	}
	for _, page := range userDocs(t, root) {
		if isBenchmarkPage(page) {
			continue
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name := page[len(root)+1:]
		for _, v := range figureViolations(string(b), bench) {
			t.Errorf("%s:%d: %q is a measured figure outside the benchmark pages: move it to docs/benchmarks*.md (with date, commit and command) and link there, or quote the figure written there with a link to it; a default or a limit names itself (\"30 s by default\", \"at most 1 MiB\")", name, v.line, v.figure)
		}
	}
}

func isBenchmarkPage(page string) bool {
	return filepath.Base(filepath.Dir(page)) == "docs" && strings.HasPrefix(filepath.Base(page), "benchmarks")
}

type figureViolation struct {
	line   int
	figure string
}

// figureViolations is the rule above applied to one page's text.
func figureViolations(page string, bench map[string]string) []figureViolation {
	var out []figureViolation
	for _, blk := range blocks(page) {
		var linked []string
		for _, m := range benchmarkLink.FindAllStringSubmatch(blk.text, -1) {
			linked = append(linked, bench[filepath.Base(m[1])])
		}
		text := linkTarget.ReplaceAllString(codeSpan.ReplaceAllString(blk.text, "``"), "]()")
		for _, loc := range figure.FindAllStringSubmatchIndex(text, -1) {
			fig := text[loc[2]:loc[5]]
			if isSetting(text[:loc[2]], text[loc[5]:]) || quoted(fig, linked) {
				continue
			}
			out = append(out, figureViolation{blk.line + strings.Count(text[:loc[2]], "\n"), fig})
		}
	}
	return out
}

// quoted reports whether fig is written in one of the linked pages' figures.
func quoted(fig string, linked []string) bool {
	n := "|" + normalFigure(fig) + "|"
	for _, figs := range linked {
		if strings.Contains(figs, n) {
			return true
		}
	}
	return false
}

// normalFigures lists every figure of a page, normalised, between bars.
func normalFigures(page string) string {
	var b strings.Builder
	b.WriteString("|")
	for _, m := range figure.FindAllStringSubmatch(page, -1) {
		b.WriteString(normalFigure(m[1] + m[2]))
		b.WriteString("|")
	}
	return b.String()
}

func normalFigure(fig string) string {
	return strings.NewReplacer(" ", "", "\u00a0", "").Replace(fig)
}

// clauseEnd splits a clause from its neighbours.
var clauseEnd = regexp.MustCompile(`[.;]\s|;`)

// isSetting reports whether a setting word is among the six words before the
// figure or the three after it, within its clause.
func isSetting(before, after string) bool {
	if locs := clauseEnd.FindAllStringIndex(before, -1); len(locs) > 0 {
		before = before[locs[len(locs)-1][1]:]
	}
	if loc := clauseEnd.FindStringIndex(after); loc != nil {
		after = after[:loc[0]]
	}
	words := func(s string) []string {
		return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
			return !(r >= 'a' && r <= 'z')
		})
	}
	b, a := words(before), words(after)
	if len(b) > 6 {
		b = b[len(b)-6:]
	}
	if len(a) > 3 {
		a = a[:3]
	}
	for _, ws := range [][]string{b, a} {
		for i, w := range ws {
			if settingWord.MatchString(w) || i > 0 && settingWord.MatchString(ws[i-1]+" "+w) {
				return true
			}
		}
	}
	return false
}

type block struct {
	line int // first line, from 1
	text string
}

// blocks splits a page's prose into paragraphs, list items and table rows,
// leaving out fenced code.
func blocks(page string) []block {
	var out []block
	var cur *block
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	fenced := false
	for i, line := range strings.Split(page, "\n") {
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "```") {
			fenced = !fenced
			flush()
			continue
		}
		starts := trim == "" || strings.HasPrefix(trim, "|") || strings.HasPrefix(trim, "#") ||
			strings.HasPrefix(trim, "- ") || strings.HasPrefix(trim, "* ") || listNumber.MatchString(trim)
		if fenced || starts {
			flush()
		}
		if fenced || trim == "" {
			continue
		}
		if cur == nil {
			cur = &block{line: i + 1}
		} else {
			cur.text += "\n"
		}
		cur.text += line
		if strings.HasPrefix(trim, "|") || strings.HasPrefix(trim, "#") {
			flush()
		}
	}
	flush()
	return out
}

var listNumber = regexp.MustCompile(`^\d+\. `)

// TestFigureRule holds the rule itself to cases, so that it cannot drift
// into passing everything.
func TestFigureRule(t *testing.T) {
	bench := map[string]string{"benchmarks.md": normalFigures("| probe | 28–34 ms |\nwake p50 112 ms")}
	for _, c := range []struct {
		text string
		bad  []string
	}{
		{"A checkpoint takes 42 ms here.", []string{"42 ms"}},
		{"kcr standby holds a few MiB, 26.5 MiB here.", []string{"26.5 MiB"}},
		{"It sends ~0.2 requests/s while asleep.", []string{"0.2 requests/s"}},
		{"A range: 25–30 ms.", []string{"25–30 ms"}},
		{"The probe costs [28–34 ms](benchmarks.md#probe).", nil},
		{"The probe costs 28–34 ms\n([measured](benchmarks.md#probe)).", nil},
		{"The probe costs [about 30 ms](benchmarks.md#probe).", []string{"30 ms"}},
		{"The probe costs 28–34 ms ([elsewhere](kubernetes.md)).", []string{"28–34 ms"}},
		{"The session lasts 30 s by default.", nil},
		{"It reads at most 16 MiB.", nil},
		{"It polls every 25 ms. It took 40 ms.", []string{"40 ms"}},
		{"The placeholder's session (30 s) outlasts it.", nil},
		{"Run `kcr standby --idle 60s`.", nil},
		{"```\ncold start 3064 ms\n```", nil},
		{"| a | 5.4 s |", []string{"5.4 s"}},
		{"KIP-848 s and v1.2 are no figures.", nil},
	} {
		var got []string
		for _, v := range figureViolations(c.text, bench) {
			got = append(got, v.figure)
		}
		if strings.Join(got, ",") != strings.Join(c.bad, ",") {
			t.Errorf("%q: flagged %q, want %q", c.text, got, c.bad)
		}
	}
}
