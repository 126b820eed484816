package archcheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function in the product may be, from its
// func line to its closing brace: longer ones read better as named steps.
const maxFuncLines = 80

// longFuncAllowed names the functions over maxFuncLines that are known and
// waiting to be split, as "dir.Recv.Name" (or "dir.Name"), each with its
// length now. The list may only shrink: a listed function that grows fails,
// and one that is shorter or gone fails too until its entry is lowered or
// removed, so the list says what is.
var longFuncAllowed = map[string]int{}

// TestFunctionLength fails for a function of the module's product code
// (every .go file but tests and test/, examples/ included) over
// maxFuncLines lines, naming each one, and for an entry of longFuncAllowed
// that no longer says the function's length.
func TestFunctionLength(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	var long []string
	seen := map[string]int{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "test" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := funcName(filepath.ToSlash(filepath.Dir(rel)), fn)
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n <= maxFuncLines {
				continue
			}
			seen[name] = n
			if allowed, ok := longFuncAllowed[name]; !ok || n > allowed {
				long = append(long, name+" ("+fset.Position(fn.Pos()).String()[len(root)+1:]+", "+strconv.Itoa(n)+" lines)")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(long)
	for _, l := range long {
		t.Errorf("function over %d lines: %s: split it into named steps", maxFuncLines, l)
	}
	for name, allowed := range longFuncAllowed {
		switch n := seen[name]; {
		case n == 0:
			t.Errorf("longFuncAllowed names %s, which is no longer over %d lines (or no longer exists): remove it", name, maxFuncLines)
		case n < allowed:
			t.Errorf("longFuncAllowed gives %s %d lines, but it has %d now: lower its entry to %d", name, allowed, n, n)
		}
	}
}

// funcName is "dir.Recv.Name" for a method, "dir.Name" for a function.
func funcName(dir string, fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return dir + "." + fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		}
		break
	}
	if id, ok := typ.(*ast.Ident); ok {
		return dir + "." + id.Name + "." + fn.Name.Name
	}
	return dir + "." + fn.Name.Name
}
