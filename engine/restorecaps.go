package engine

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/criu"
)

// ErrMissingCaps is returned for an image whose process had capabilities
// that kcr has not: CRIU could not give them back.
var ErrMissingCaps = errors.New("missing capabilities")

// checkCaps refuses, before CRIU starts, to restore the tree dumped in
// criuDir when one of its tasks had a capability kcr has not. CRIU's
// restorer sets each task's sets with capset(2), which grants no
// permitted capability its caller lacks: CRIU then fails late, with the
// tree half-built, and waits for tasks that wait for it.
func checkCaps(image, criuDir string) error {
	img, err := criu.ImageCaps(criuDir)
	if err != nil {
		return nil // CRIU reads the same files, and says what is wrong
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return nil // CRIU will tell
	}
	last, err := lastCap()
	if err != nil {
		return nil
	}
	own := criu.Caps{
		Prm: uint64(data[1].Permitted)<<32 | uint64(data[0].Permitted),
		Inh: uint64(data[1].Inheritable)<<32 | uint64(data[0].Inheritable),
		Bnd: boundingSet(last),
	}
	missing := missingCaps(img, own, last)
	if len(missing) == 0 {
		return nil
	}
	names := make([]string, len(missing))
	for i, c := range missing {
		names[i] = CapName(c)
	}
	it := "them"
	if len(names) == 1 {
		it = "it"
	}
	return fmt.Errorf("%s: the process was dumped with %s, which kcr lacks, and CRIU gives no process more capabilities than its own (%w): run kcr with %s (in a container: add %s to the container's capabilities), or restore where kcr has %s",
		image, strings.Join(names, ", "), ErrMissingCaps, it, it, it)
}

// missingCaps are the capabilities, up to last, that capset(2) in a task
// with the sets own cannot give a task that had img's: a permitted one
// own lacks, or an inheritable one neither its inheritable nor its
// bounding set has.
func missingCaps(img, own criu.Caps, last uintptr) []uintptr {
	lack := img.Prm&^own.Prm | img.Inh&^(own.Inh|own.Bnd)
	var caps []uintptr
	for c := uintptr(0); c <= last && c < 64; c++ {
		if lack&(1<<c) != 0 {
			caps = append(caps, c)
		}
	}
	return caps
}

// boundingSet is the calling thread's bounding set, up to last.
func boundingSet(last uintptr) uint64 {
	var b uint64
	for c := uintptr(0); c <= last && c < 64; c++ {
		if on, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, c, 0, 0, 0); err == nil && on == 1 {
			b |= 1 << c
		}
	}
	return b
}
