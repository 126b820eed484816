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
const maxFuncLines = 100

// longFuncAllowed names the functions over maxFuncLines that are known and
// being mended, as "dir.Recv.Name" (or "dir.Name"); it must hold no function
// that is short enough, so that it empties as they are split.
var longFuncAllowed = map[string]bool{}

// TestFunctionLength fails for a function of the product (not tests, not
// examples/, not test/) over maxFuncLines lines, naming each one.
func TestFunctionLength(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	var long []string
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "examples" || rel == "test" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
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
			seen[name] = true
			if !longFuncAllowed[name] {
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
	for name := range longFuncAllowed {
		if !seen[name] {
			t.Errorf("longFuncAllowed names %s, which is no longer over %d lines (or no longer exists): remove it", name, maxFuncLines)
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
