package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/internal/testkit/heaptest"
)

// kcr standby --lazy: each wake restores the heap on demand (the lazy-pages
// daemon's work directory is there), the heap is intact, and the next
// checkpoint, once the daemon is done, removes that directory.
func TestStandbyLazy(t *testing.T) {
	need(t)
	bin := filepath.Join(binDir, "lazyheap")
	if out, err := exec.Command("go", "build", "-o", bin, "../apps/lazyheap").CombinedOutput(); err != nil {
		t.Fatalf("build lazyheap: %v\n%s", err, out)
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	dir := filepath.Join(t.TempDir(), "img")
	k := &kafkaEnv{t: t}
	const mb = 64
	s := k.startStandbyNoKafka(dir, []string{"--idle", "1s", "--lazy", "-e", "GODEBUG=multipathtcp=0"},
		bin, "-notify", "-mb", "64", "-listen", addr)
	h := &heaptest.Heap{Addr: addr}
	ctx := context.Background()
	var sum0 string
	for cycle := 1; cycle <= 2; cycle++ {
		st := s.waitState("standby", 60*time.Second)
		checkLazyDirs(t, dir, st.Image)
		if out, err := (kcrOpts{}).cmd("standby", "wake", "--image-dir", dir).CombinedOutput(); err != nil {
			t.Fatalf("cycle %d: kcr standby wake: %v: %s", cycle, err, out)
		}
		s.waitState("running", 60*time.Second)
		if _, err := os.Stat(filepath.Join(dir, "lazy-"+st.Image)); err != nil {
			t.Errorf("cycle %d: no lazy-pages work directory for %s: %v", cycle, st.Image, err)
		}
		sum, pages, took, err := h.Sum(ctx)
		if err != nil {
			t.Fatalf("cycle %d: %v", cycle, err)
		}
		if pages != mb<<8 || (sum0 != "" && sum != sum0) {
			t.Fatalf("cycle %d: sum %s of %d pages, want %s of %d", cycle, sum, pages, sum0, mb<<8)
		}
		sum0 = sum
		t.Logf("cycle %d: heap intact after a lazy wake (full pass %v inside the service)", cycle, took)
	}
	checkLazyDirs(t, dir, s.waitState("standby", 60*time.Second).Image)
}

// checkLazyDirs fails if a lazy-pages work directory other than the one of
// image (prepared for its restore) is left in dir.
func checkLazyDirs(t *testing.T, dir, image string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(dir, "lazy-*"))
	for _, d := range dirs {
		if filepath.Base(d) != "lazy-"+image {
			t.Errorf("lazy-pages work directory %s left after the checkpoint of %s", d, image)
		}
	}
}

// kcr standby without --lazy chooses by the image: an 80 MiB heap is
// restored lazily (the lazy-pages daemon's work directory is there) under
// the default --lazy-above (64 MiB), eagerly under --lazy-above 128; the
// heap is intact either way.
func TestStandbyLazyAuto(t *testing.T) {
	need(t)
	bin := filepath.Join(binDir, "lazyheap")
	if out, err := exec.Command("go", "build", "-o", bin, "../apps/lazyheap").CombinedOutput(); err != nil {
		t.Fatalf("build lazyheap: %v\n%s", err, out)
	}
	const mb = 80
	for _, c := range []struct {
		flags []string
		lazy  bool
	}{
		{nil, true},
		{[]string{"--lazy-above", "128"}, false},
	} {
		probe, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := probe.Addr().String()
		probe.Close()
		dir := filepath.Join(t.TempDir(), "img")
		k := &kafkaEnv{t: t}
		s := k.startStandbyNoKafka(dir, append([]string{"--idle", "1s", "-e", "GODEBUG=multipathtcp=0"}, c.flags...),
			bin, "-notify", "-mb", "80", "-listen", addr)
		st := s.waitState("standby", 60*time.Second)
		if out, err := (kcrOpts{}).cmd("standby", "wake", "--image-dir", dir).CombinedOutput(); err != nil {
			t.Fatalf("%q: kcr standby wake: %v: %s", c.flags, err, out)
		}
		s.waitState("running", 60*time.Second)
		_, err = os.Stat(filepath.Join(dir, "lazy-"+st.Image))
		if lazy := err == nil; lazy != c.lazy {
			t.Errorf("%q: restored lazily: %v, want %v (%v)", c.flags, lazy, c.lazy, err)
		}
		_, pages, _, err := (&heaptest.Heap{Addr: addr}).Sum(context.Background())
		if err != nil || pages != mb<<8 {
			t.Fatalf("%q: heap after the wake: %d pages, %v; want %d", c.flags, pages, err, mb<<8)
		}
		s.stop(syscall.SIGTERM)
	}
}
