package standby

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
)

// writeImage makes a complete fake image name in dir.
func writeImage(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name, images.ManifestName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// leaveState opens dir as a killed supervisor would have left it: state st
// and the complete images imgs.
func leaveState(t *testing.T, dir string, st persisted, imgs ...string) {
	t.Helper()
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	for _, img := range imgs {
		writeImage(t, dir, img)
	}
	if err := d.writeState(st); err != nil {
		t.Fatal(err)
	}
}

// What a new supervisor does with each state a killed one can leave, when
// no copy of the service runs.
func TestResolveLeftStates(t *testing.T) {
	for _, c := range []struct {
		name     string
		st       persisted
		imgs     []string
		want     State
		starts   int
		restores []string
	}{
		{"checkpointing, image complete", persisted{State: StateCheckpointing, PID: 7, Start: 7, Image: imageName(2)},
			[]string{imageName(1), imageName(2)}, StateStandby, 0, nil},
		{"checkpointing, no image", persisted{State: StateCheckpointing, PID: 7, Start: 7, Image: imageName(2)},
			[]string{imageName(1)}, StateRunning, 1, nil},
		{"restoring", persisted{State: StateRestoring, Image: imageName(1)},
			[]string{imageName(1)}, StateRunning, 0, []string{imageName(1)}},
		{"starting", persisted{State: StateStarting}, nil, StateRunning, 1, nil},
		{"standby", persisted{State: StateStandby, Image: imageName(3)}, []string{imageName(3)}, StateStandby, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "img")
			leaveState(t, dir, c.st, c.imgs...)
			f := newFake()
			r := startRig(t, f, dir, func(o *Options) { o.Idle = time.Hour })
			r.waitState(c.want)
			starts, restores, _ := f.snapshot()
			if starts != c.starts || len(restores) != len(c.restores) || (len(restores) > 0 && restores[0] != c.restores[0]) {
				t.Fatalf("starts %d, restores %v; want %d and %v", starts, restores, c.starts, c.restores)
			}
		})
	}
}

// A copy of the service that runs although the state file names none (the
// supervisor was killed before it wrote its PID) is adopted, and a second
// one is killed: never two copies, never a cold start beside them.
func TestResolveAdoptsOneCopy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	leaveState(t, dir, persisted{State: StateStarting})
	f := newFake()
	a, b := f.spawn(), f.spawn()
	r := startRig(t, f, dir, func(o *Options) { o.Idle = time.Hour })
	r.waitState(StateRunning)
	if starts, _, _ := f.snapshot(); starts != 0 {
		t.Fatalf("%d cold starts beside the running copies", starts)
	}
	if n := len(f.copies()); n != 1 {
		t.Fatalf("%d copies left, want 1", n)
	}
	if got := r.s.Status().PID; got != a.PID && got != b.PID {
		t.Fatalf("running PID %d, want %d or %d", got, a.PID, b.PID)
	}
}

// A sleep asked for in an earlier cycle is spent: the next copy is not
// checkpointed for it.
func TestStaleSleepIgnored(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	f := newFake()
	r := startRig(t, f, dir, func(o *Options) { o.Idle = time.Hour })
	r.waitState(StateRunning)
	offer(r.s.sleepCh, request{cycle: r.s.currentCycle() - 1})
	if !r.s.Sleep() {
		t.Fatal("Sleep refused while running")
	}
	r.waitState(StateStandby)
	offer(r.s.sleepCh, request{cycle: r.s.currentCycle()}) // made before the wake
	r.s.Wake("manual")
	r.waitState(StateRunning)
	time.Sleep(100 * time.Millisecond)
	if _, _, ckpts := f.snapshot(); len(ckpts) != 1 {
		t.Fatalf("%d checkpoints, want 1: a stale sleep checkpointed the new copy", len(ckpts))
	}
}

func TestCheckpointBackoff(t *testing.T) {
	o := &Options{Idle: time.Second, CheckpointBackoffMax: 5 * time.Second}
	for n, want := range map[int]time.Duration{0: time.Second, 1: 2 * time.Second, 2: 4 * time.Second, 3: 5 * time.Second, 30: 5 * time.Second} {
		if got := ckptBackoff(o, n); got != want {
			t.Errorf("ckptBackoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// A restore that fails on a full disk does not set the image aside as bad:
// the service starts cold, and the image stays the one to restore.
func TestRestoreDiskFullKeepsImage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "img")
	leaveState(t, dir, persisted{State: StateStandby, Image: imageName(1)}, imageName(1))
	f := newFake()
	f.restoreErr = fmt.Errorf("write restore counter: %w", &os.PathError{Op: "write", Path: "restores", Err: syscall.ENOSPC})
	r := startRig(t, f, dir, func(o *Options) { o.Idle = time.Hour })
	r.waitState(StateStandby)
	r.s.Wake("manual")
	r.waitState(StateRunning)
	if _, err := os.Stat(filepath.Join(dir, imageName(1), images.ManifestName)); err != nil {
		t.Fatalf("the image was set aside: %v", err)
	}
	if bad, _ := filepath.Glob(filepath.Join(dir, badPrefix+"*")); len(bad) != 0 {
		t.Fatalf("images set aside: %v", bad)
	}
}

// diskFull knows a full disk by its error, kcr's own or CRIU's (from its
// log), never by a message's text.
func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("write restore counter: %w", &os.PathError{Op: "write", Path: "restores", Err: syscall.ENOSPC}), true},
		{fmt.Errorf("restore: %w", &os.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT}), true},
		{fmt.Errorf("restore img-000001: %w", &criu.Error{Op: "restore", First: "Unable to open pstree.img: No space left on device", Cause: criu.CauseDiskFull}), true},
		{&criu.Error{Op: "restore", First: "Can't fork for 77: File exists", Cause: criu.CausePIDInUse}, false},
		{errors.New("restored PID 7, which exited already: the app said: no space left on device"), false},
	} {
		if got := diskFull(tc.err); got != tc.want {
			t.Errorf("diskFull(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A placeholder's record that could not be written is written when the
// hold hands it in again: the skip of a repeated record counts only what
// reached the state file.
func TestHoldSavedRetriedAfterFailedWrite(t *testing.T) {
	dir := t.TempDir()
	d, err := openImageDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	s := &Supervisor{dir: d, log: slog.New(slog.DiscardHandler)}
	h := holdSaved{HoldMember: "kcr-hold-1", HoldProtocol: "range"}
	// A directory where the state file goes makes its rename fail.
	block := filepath.Join(dir, stateFileName)
	if err := os.Mkdir(block, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.setHoldSaved(h.HoldMember, h.HoldProtocol); err == nil {
		t.Fatal("setHoldSaved: no error with the state file blocked")
	}
	if err := os.Remove(block); err != nil {
		t.Fatal(err)
	}
	if err := s.setHoldSaved(h.HoldMember, h.HoldProtocol); err != nil {
		t.Fatalf("setHoldSaved again: %v", err)
	}
	st, err := d.readState()
	if err != nil {
		t.Fatal(err)
	}
	if st.holdSaved != h {
		t.Fatalf("state file hold %+v, want %+v", st.holdSaved, h)
	}
	// Written once: the same record again does not write (the state
	// file, removed, stays away).
	if err := os.Remove(block); err != nil {
		t.Fatal(err)
	}
	if err := s.setHoldSaved(h.HoldMember, h.HoldProtocol); err != nil {
		t.Fatalf("setHoldSaved a third time: %v", err)
	}
	if _, err := os.Stat(block); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the same record was written again (state file: %v)", err)
	}
}
