package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// CRIU image magics (criu/include/magic.h). An image starts with a "primary"
// magic (common or service) and the image type's own magic, followed by
// entries, each a little-endian uint32 length and a protobuf message.
//
// The few messages kcr needs (stats, pstree) are decoded by hand with
// protowire rather than with go-criu's generated types: go-criu's stats and
// crit packages register the same protobuf names, and linking both into one
// binary panics at init; decoding by hand keeps this package out of that.
const (
	imgCommonMagic  = 0x54564319
	imgServiceMagic = 0x55105940
	statsMagic      = 0x57093306
	pstreeMagic     = 0x50273030
)

// Image file names CRIU uses.
const (
	StatsDumpFile    = "stats-dump"
	StatsRestoreFile = "stats-restore"
	PstreeFile       = "pstree.img"
)

func readImage(path string, primary, magic uint32) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != primary || binary.LittleEndian.Uint32(b[4:]) != magic {
		return nil, fmt.Errorf("criu: %s: not a CRIU image of the expected type", path)
	}
	var entries [][]byte
	for b = b[8:]; len(b) > 0; {
		if len(b) < 4 {
			return nil, fmt.Errorf("criu: %s: truncated entry header", path)
		}
		n := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("criu: %s: truncated entry", path)
		}
		entries = append(entries, b[:n])
		b = b[n:]
	}
	return entries, nil
}

// fields decodes the varint fields of a protobuf message; repeated varints
// (packed or not) accumulate in order. Non-varint fields are skipped, except
// that packed repeated fields (length-delimited) are unpacked as varints.
func fields(msg []byte, packed map[protowire.Number]bool) (map[protowire.Number][]uint64, map[protowire.Number][]byte, error) {
	vals := map[protowire.Number][]uint64{}
	subs := map[protowire.Number][]byte{}
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		msg = msg[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(msg)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			vals[num] = append(vals[num], v)
			msg = msg[n:]
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			if packed[num] {
				for len(v) > 0 {
					x, m := protowire.ConsumeVarint(v)
					if m < 0 {
						return nil, nil, protowire.ParseError(m)
					}
					vals[num] = append(vals[num], x)
					v = v[m:]
				}
			} else {
				subs[num] = v
			}
			msg = msg[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			msg = msg[n:]
		}
	}
	return vals, subs, nil
}

func first(v map[protowire.Number][]uint64, n protowire.Number) uint64 {
	if len(v[n]) == 0 {
		return 0
	}
	return v[n][0]
}

func us(v uint64) time.Duration { return time.Duration(v) * time.Microsecond }

// DumpStats is CRIU's stats-dump image (times are CRIU's own measurements).
type DumpStats struct {
	FreezingTime time.Duration // stopping the tree
	FrozenTime   time.Duration // the tree was frozen this long
	MemdumpTime  time.Duration // collecting memory (into pipes)
	MemwriteTime time.Duration // writing pages to the images
	IrmapResolve time.Duration

	PagesScanned       uint64
	PagesSkippedParent uint64
	PagesWritten       uint64
	PagesLazy          uint64
	PagePipes          uint64
	PagePipeBufs       uint64
	ShpagesScanned     uint64
	ShpagesSkipped     uint64
	ShpagesWritten     uint64
}

// RestoreStats is CRIU's stats-restore image.
type RestoreStats struct {
	PagesCompared   uint64
	PagesSkippedCOW uint64
	PagesRestored   uint64
	ForkingTime     time.Duration
	RestoreTime     time.Duration
}

// Entries of a stats image.
const (
	statsDumpEntry    protowire.Number = 1
	statsRestoreEntry protowire.Number = 2
)

// readStats returns the fields of the stats image's entry (statsDumpEntry
// or statsRestoreEntry, named what in errors).
func readStats(path string, entry protowire.Number, what string) (map[protowire.Number][]uint64, error) {
	entries, err := readImage(path, imgServiceMagic, statsMagic)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("criu: %s: empty stats image", path)
	}
	_, subs, err := fields(entries[0], nil)
	if err != nil {
		return nil, fmt.Errorf("criu: %s: %w", path, err)
	}
	if subs[entry] == nil {
		return nil, fmt.Errorf("criu: %s: no %s entry", path, what)
	}
	v, _, err := fields(subs[entry], nil)
	if err != nil {
		return nil, fmt.Errorf("criu: %s: %w", path, err)
	}
	return v, nil
}

// ReadDumpStats reads dir/stats-dump (CRIU writes it to its work directory,
// which for Dump is the images directory).
func ReadDumpStats(dir string) (*DumpStats, error) {
	v, err := readStats(filepath.Join(dir, StatsDumpFile), statsDumpEntry, "dump")
	if err != nil {
		return nil, err
	}
	return &DumpStats{
		FreezingTime:       us(first(v, 1)),
		FrozenTime:         us(first(v, 2)),
		MemdumpTime:        us(first(v, 3)),
		MemwriteTime:       us(first(v, 4)),
		PagesScanned:       first(v, 5),
		PagesSkippedParent: first(v, 6),
		PagesWritten:       first(v, 7),
		IrmapResolve:       us(first(v, 8)),
		PagesLazy:          first(v, 9),
		PagePipes:          first(v, 10),
		PagePipeBufs:       first(v, 11),
		ShpagesScanned:     first(v, 12),
		ShpagesSkipped:     first(v, 13),
		ShpagesWritten:     first(v, 14),
	}, nil
}

// ReadRestoreStats reads dir/stats-restore (CRIU writes it to its work
// directory: RestoreOptions.WorkDir).
func ReadRestoreStats(dir string) (*RestoreStats, error) {
	v, err := readStats(filepath.Join(dir, StatsRestoreFile), statsRestoreEntry, "restore")
	if err != nil {
		return nil, err
	}
	return &RestoreStats{
		PagesCompared:   first(v, 1),
		PagesSkippedCOW: first(v, 2),
		ForkingTime:     us(first(v, 3)),
		RestoreTime:     us(first(v, 4)),
		PagesRestored:   first(v, 5),
	}, nil
}

// Task is one process of a dumped tree (an entry of pstree.img).
type Task struct {
	PID, PPID, PGID, SID int
	Threads              []int // thread IDs, the main thread (== PID) included
}

// ImageTasks lists the processes of the tree dumped in imagesDir. Restore
// recreates each with its original PID and each thread with its original
// TID, so all of them must be free.
func ImageTasks(imagesDir string) ([]Task, error) {
	path := filepath.Join(imagesDir, PstreeFile)
	entries, err := readImage(path, imgCommonMagic, pstreeMagic)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("criu: %s is not a CRIU image directory (no %s)", imagesDir, PstreeFile)
		}
		return nil, err
	}
	var tasks []Task
	for _, e := range entries {
		v, _, err := fields(e, map[protowire.Number]bool{5: true})
		if err != nil {
			return nil, fmt.Errorf("criu: %s: %w", path, err)
		}
		t := Task{PID: int(first(v, 1)), PPID: int(first(v, 2)), PGID: int(first(v, 3)), SID: int(first(v, 4))}
		for _, tid := range v[5] {
			t.Threads = append(t.Threads, int(tid))
		}
		tasks = append(tasks, t)
	}
	return tasks, nil
}

// coreMagic is a task's core image (core-TID.img, one per thread).
const coreMagic = 0x55053847

// Caps are capability sets, bit N for capability N (capabilities(7)).
type Caps struct {
	Inh, Prm, Eff, Bnd uint64
}

// ImageCaps returns the union, over every thread of the tree dumped in
// imagesDir, of the capability sets CRIU restores as they were: the
// restorer sets them on each thread with capset(2), which refuses a
// permitted set larger than the restoring CRIU's own.
func ImageCaps(imagesDir string) (Caps, error) {
	tasks, err := ImageTasks(imagesDir)
	if err != nil {
		return Caps{}, err
	}
	var all Caps
	for _, t := range tasks {
		tids := t.Threads
		if len(tids) == 0 {
			tids = []int{t.PID}
		}
		for _, tid := range tids {
			c, err := threadCaps(filepath.Join(imagesDir, fmt.Sprintf("core-%d.img", tid)))
			if err != nil {
				return Caps{}, err
			}
			all.Inh |= c.Inh
			all.Prm |= c.Prm
			all.Eff |= c.Eff
			all.Bnd |= c.Bnd
		}
	}
	return all, nil
}

// threadCaps reads the capability sets of one core image: core_entry's
// thread_core (5), its creds (10): cap_inh 9, cap_prm 10, cap_eff 11,
// cap_bnd 12, each 32-bit words, low first.
func threadCaps(path string) (Caps, error) {
	entries, err := readImage(path, imgCommonMagic, coreMagic)
	if err != nil {
		return Caps{}, err
	}
	if len(entries) == 0 {
		return Caps{}, fmt.Errorf("criu: %s: no entry", path)
	}
	_, subs, err := fields(entries[0], nil)
	if err == nil && subs[5] != nil {
		_, subs, err = fields(subs[5], nil)
	}
	if err != nil {
		return Caps{}, fmt.Errorf("criu: %s: %w", path, err)
	}
	if subs[10] == nil {
		return Caps{}, fmt.Errorf("criu: %s: no credentials", path)
	}
	packed := map[protowire.Number]bool{9: true, 10: true, 11: true, 12: true}
	v, _, err := fields(subs[10], packed)
	if err != nil {
		return Caps{}, fmt.Errorf("criu: %s: %w", path, err)
	}
	word := func(n protowire.Number) uint64 {
		var c uint64
		for i, w := range v[n] {
			if i < 2 {
				c |= (w & 0xffffffff) << (32 * i)
			}
		}
		return c
	}
	return Caps{Inh: word(9), Prm: word(10), Eff: word(11), Bnd: word(12)}, nil
}
