package archcheck

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const (
	module  = "github.com/kcr-dev/kcr"
	archDoc = "docs/architecture.md"
)

// mapRow matches a row of architecture.md's package table:
// | `path` | job | `imp`, `imp` (or —) |
var mapRow = regexp.MustCompile("^\\| `([^`]+)` \\| ([^|]+) \\| ([^|]+) \\|$")

// TestArchitectureMap fails when a package of `go list ./...` has no row in
// docs/architecture.md's table, when a row names a package that is gone, or
// when a package imports a kcr package its row does not allow.
func TestArchitectureMap(t *testing.T) {
	root := repoRoot(t)
	allowed := readMap(t, filepath.Join(root, archDoc))
	pkgs := listPackages(t, root)
	for _, p := range pkgs {
		may, ok := allowed[p.path]
		if !ok {
			t.Errorf("%s has no row in %s: add `| `%s` | its one job | the kcr packages it may import |`", p.path, archDoc, p.path)
			continue
		}
		for _, imp := range p.imports {
			if !may[imp] {
				t.Errorf("%s imports %s, which its row in %s does not allow: change the import or, if the direction is right, the map", p.path, imp, archDoc)
			}
		}
	}
	listed := map[string]bool{}
	for _, p := range pkgs {
		listed[p.path] = true
	}
	for path := range allowed {
		if !listed[path] {
			t.Errorf("%s has a row for %s, which `go list ./...` does not list: remove or rename the row", archDoc, path)
		}
	}
}

// forbiddenDeps are, for a package, the packages it must not depend on,
// even through others (prefixes of import paths): docs/architecture.md,
// "Kafka stays out of the supervisor".
var forbiddenDeps = map[string][]string{
	"standby": {"github.com/segmentio/kafka-go", "github.com/twmb/franz-go",
		module + "/standby/kafkawake", module + "/standby/kafkastandby"},
}

// TestForbiddenDeps fails when a package of forbiddenDeps depends on one
// it must not: the supervisor knows wake sources, a group keeper and a
// backend, not Kafka, which cmd/kcr wires in (package kafkastandby).
func TestForbiddenDeps(t *testing.T) {
	root := repoRoot(t)
	for pkg, bad := range forbiddenDeps {
		cmd := exec.Command("go", "list", "-deps", "./"+pkg)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v: %s", pkg, err, stderr.String())
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s (%s must not): move what needs it out of %s, behind the interfaces it owns", pkg, dep, b, pkg)
				}
			}
		}
	}
}

// readMap returns, for each package row of the map, the set of kcr packages
// (relative to the module) that it may import.
func readMap(t *testing.T, path string) map[string]map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		m := mapRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		pkg := m[1]
		if _, dup := rows[pkg]; dup {
			t.Errorf("%s: two rows for %s", archDoc, pkg)
		}
		may := map[string]bool{}
		for _, f := range strings.Split(m[3], ",") {
			f = strings.TrimSpace(f)
			if f == "—" || f == "" {
				continue
			}
			if len(f) < 3 || f[0] != '`' || f[len(f)-1] != '`' {
				t.Errorf("%s: row %s: %q is not a `package` (write — for none)", archDoc, pkg, f)
				continue
			}
			may[f[1:len(f)-1]] = true
		}
		rows[pkg] = may
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no package rows of the form | `path` | job | `imports` |", archDoc)
	}
	return rows
}

type pkgImports struct {
	path    string   // relative to the module
	imports []string // kcr packages imported by the non-test files, relative
}

// listPackages runs `go list ./...` and keeps each package's kcr imports.
func listPackages(t *testing.T, root string) []pkgImports {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v: %s", err, stderr.String())
	}
	var pkgs []pkgImports
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pi := pkgImports{path: rel(p.ImportPath)}
		for _, imp := range p.Imports {
			if r := rel(imp); r != imp {
				pi.imports = append(pi.imports, r)
			}
		}
		sort.Strings(pi.imports)
		pkgs = append(pkgs, pi)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed no package")
	}
	return pkgs
}

// rel is a kcr package's path inside the module; other paths are unchanged.
func rel(importPath string) string {
	if r, ok := strings.CutPrefix(importPath, module+"/"); ok {
		return r
	}
	return importPath
}

// repoRoot is the directory holding go.mod, above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
