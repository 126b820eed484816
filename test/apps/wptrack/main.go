// Command wptrack measures the kernel's write tracking of anonymous memory
// through userfaultfd's asynchronous write-protect mode and the
// PAGEMAP_SCAN ioctl (Linux >= 6.7): the dirty-page tracking a kernel
// without soft-dirty bits (CONFIG_MEM_SOFT_DIRTY) still offers, and that
// CRIU does not use. It maps -mb MiB, touches every page, registers the
// range write-protected (UFFD_FEATURE_WP_ASYNC: a write un-protects its page
// in the kernel, no handler), write-protects it all with one scan, writes
// one page in -every, and scans for the written pages:
//
//	wptrack -mb 2048 -every 100
//
// It prints each step's time and the pages each scan found, and exits 1 if
// a scan finds other pages than those written.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// From the kernel's UAPI headers (linux/userfaultfd.h, linux/fs.h), which
// golang.org/x/sys does not carry.
const (
	uffdAPI              = 0xAA
	uffdioAPI            = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister       = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdFeatureWPUnpop   = 1 << 13
	uffdFeatureWPAsync   = 1 << 15
	uffdioRegisterModeWP = 1 << 1

	pagemapScan      = 0xc0606610 // _IOWR('f', 16, struct pm_scan_arg)
	pageIsWritten    = 1 << 1
	pmScanWPMatching = 1 << 0 // write-protect the pages found again
	pmScanCheckAsync = 1 << 1 // fail on a page not under async write-protect
	pageSize         = 4096
)

// pmScanArg is struct pm_scan_arg.
type pmScanArg struct {
	Size, Flags, Start, End, WalkEnd, Vec, VecLen, MaxPages       uint64
	CategoryInverted, CategoryMask, CategoryAnyofMask, ReturnMask uint64
}

// pageRegion is struct page_region.
type pageRegion struct{ Start, End, Categories uint64 }

func ioctl(fd int, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return 0, e
	}
	return r, nil
}

// written returns the pages of [start, end) written since they were last
// write-protected, and write-protects them again if rearm.
func written(pagemap int, start, end uint64, rearm bool) ([]pageRegion, error) {
	vec := make([]pageRegion, 4096)
	a := pmScanArg{Start: start, End: end, Vec: uint64(uintptr(unsafe.Pointer(&vec[0]))), VecLen: uint64(len(vec)),
		CategoryMask: pageIsWritten, ReturnMask: pageIsWritten, Flags: pmScanCheckAsync}
	a.Size = uint64(unsafe.Sizeof(a))
	if rearm {
		a.Flags |= pmScanWPMatching
	}
	var out []pageRegion
	for a.Start < end {
		n, err := ioctl(pagemap, pagemapScan, unsafe.Pointer(&a))
		if err != nil {
			return nil, fmt.Errorf("PAGEMAP_SCAN: %w", err)
		}
		out = append(out, vec[:n]...)
		a.Start = a.WalkEnd
	}
	return out, nil
}

func pages(rs []pageRegion) uint64 {
	var n uint64
	for _, r := range rs {
		n += (r.End - r.Start) / pageSize
	}
	return n
}

// track registers mem with a new userfaultfd in async write-protect mode.
func track(mem []byte) error {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		return fmt.Errorf("userfaultfd: %w", e)
	}
	api := [3]uint64{uffdAPI, uffdFeatureWPAsync | uffdFeatureWPUnpop, 0}
	if _, err := ioctl(int(fd), uffdioAPI, unsafe.Pointer(&api)); err != nil {
		return fmt.Errorf("UFFDIO_API with WP_ASYNC (Linux >= 6.7): %w", err)
	}
	reg := [4]uint64{uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem)), uffdioRegisterModeWP, 0}
	if _, err := ioctl(int(fd), uffdioRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("UFFDIO_REGISTER write-protect: %w", err)
	}
	return nil // the fd stays open: closing it ends the tracking
}

func main() {
	mb := flag.Int("mb", 2048, "MiB of memory to track")
	every := flag.Int("every", 100, "write one page in this many")
	flag.Parse()
	if *mb < 1 || *every < 1 {
		fmt.Fprintln(os.Stderr, "wptrack: -mb and -every must be at least 1")
		os.Exit(2)
	}
	if err := run(*mb, *every); err != nil {
		fmt.Fprintln(os.Stderr, "wptrack:", err)
		os.Exit(1)
	}
}

func run(mb, every int) error {
	mem, err := unix.Mmap(-1, 0, mb<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	for i := 0; i < len(mem); i += pageSize {
		mem[i] = 1
	}
	if err := track(mem); err != nil {
		return err
	}
	pm, err := unix.Open("/proc/self/pagemap", unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	end := start + uint64(len(mem))
	step := func(what string, rearm bool, want uint64) error {
		t0 := time.Now()
		rs, err := written(pm, start, end, rearm)
		if err != nil {
			return err
		}
		d := time.Since(t0)
		fmt.Printf("%-44s %8d pages written, scan %v\n", what, pages(rs), d.Round(time.Microsecond))
		if want != ^uint64(0) && pages(rs) != want {
			return fmt.Errorf("%s: the scan found %d written pages, want %d", what, pages(rs), want)
		}
		return nil
	}
	fmt.Printf("%d MiB tracked (%d pages)\n", mb, len(mem)/pageSize)
	// Registered unprotected: every page counts as written until the
	// first scan protects it.
	if err := step("first scan (write-protects all)", true, uint64(len(mem)/pageSize)); err != nil {
		return err
	}
	if err := step("scan, nothing written", true, 0); err != nil {
		return err
	}
	t0 := time.Now()
	var n uint64
	for i := 0; i < len(mem); i += pageSize * every {
		mem[i] = 2
		n++
	}
	fmt.Printf("%-44s %8d pages, %v\n", fmt.Sprintf("written (1 in %d, one fault each)", every), n, time.Since(t0).Round(time.Microsecond))
	if err := step("scan (write-protects them again)", true, n); err != nil {
		return err
	}
	return step("scan, nothing written since", false, 0)
}
