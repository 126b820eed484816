package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersionCache(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KCR_CACHE_DIR", filepath.Join(dir, "cache"))
	fake := filepath.Join(dir, "criu")
	calls := filepath.Join(dir, "calls")
	write := func(version string) {
		script := "#!/bin/sh\necho x >> " + calls + "\necho 'Version: " + version + "'\n"
		if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ncalls := func() int {
		b, _ := os.ReadFile(calls)
		return strings.Count(string(b), "x")
	}
	ctx := context.Background()
	write("4.2.1")
	for i := 0; i < 3; i++ {
		v, err := readVersionCached(ctx, fake)
		if err != nil || v.String() != "4.2.1" {
			t.Fatalf("version %v, %v", v, err)
		}
	}
	if n := ncalls(); n != 1 {
		t.Fatalf("criu --version ran %d times for 3 lookups, want 1", n)
	}
	// Replacing the binary is noticed.
	os.Remove(fake)
	write("4.3")
	if v, err := readVersionCached(ctx, fake); err != nil || v.String() != "4.3" || ncalls() != 2 {
		t.Fatalf("after replacing criu: %v, %v, %d runs", v, err, ncalls())
	}
	// A damaged cache is ignored.
	os.WriteFile(filepath.Join(dir, "cache", "criu-version.json"), []byte("{"), 0o600)
	if v, err := readVersionCached(ctx, fake); err != nil || v.String() != "4.3" {
		t.Fatalf("with a damaged cache: %v, %v", v, err)
	}
}
