package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// carriedImage writes an image whose writer resource carried n records.
func carriedImage(t *testing.T, n int64, leave bool) string {
	t.Helper()
	return writeImage(t, &images.Manifest{Created: time.Now(), Process: images.Process{PID: 7, Comm: "app"}, Options: images.Options{LeaveRunning: leave},
		Resources:      []images.ResourceReport{{Name: "db", DurationNS: 1}, {Name: "kafka-writer/t", DurationNS: 1, RecordsCarried: n}},
		RecordsCarried: n}, "")
}

// kcr inspect shows the carried records, per resource and in total, in text
// and JSON.
func TestInspectCarried(t *testing.T) {
	img := carriedImage(t, 37, false)
	out, err, _ := run(t, inspectCmd(&globals{}), img)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"carried       37 records (kafka-writer/t 37)", "kafka-writer/t       0µs carried 37"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	out, err, _ = run(t, inspectCmd(&globals{json: true}), img)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Carried   int64 `json:"records_carried"`
		Resources []struct {
			Name    string `json:"name"`
			Carried int64  `json:"records_carried"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	if m.Carried != 37 || len(m.Resources) != 2 || m.Resources[1].Carried != 37 || m.Resources[0].Carried != 0 {
		t.Errorf("inspect --json: %+v", m)
	}
}

// kcr restore refuses, with exit 10 and a one-line error naming
// --allow-duplicates, to send an image's carried records twice.
func TestRestoreRefusesDuplicates(t *testing.T) {
	carried := carriedImage(t, 5, false)
	leave := carriedImage(t, 5, true)
	for _, args := range [][]string{{"--count", "2", carried}, {leave}, {"--container", "c1", leave}} {
		_, err, code := run(t, restoreCmd(&globals{}), args...)
		if !errors.Is(err, engine.ErrDuplicates) || code != exitCarried || !strings.Contains(err.Error(), "--allow-duplicates") {
			t.Errorf("restore %v: %v (exit %d), want ErrDuplicates naming --allow-duplicates, exit %d", args, err, code, exitCarried)
		}
	}
	// Allowed, or nothing to duplicate: the restore goes on (and fails
	// later on these fake images, for other reasons).
	for _, args := range [][]string{{"--count", "2", "--allow-duplicates", carried}, {"--allow-duplicates", leave}, {"--count", "2", carriedImage(t, 0, true)}} {
		if _, err, _ := run(t, restoreCmd(&globals{}), args...); err == nil || errors.Is(err, engine.ErrDuplicates) {
			t.Errorf("restore %v: %v, want a failure other than ErrDuplicates", args, err)
		}
	}
}

// A checkpoint refused by carry vetoes exits 10; beside another failure, 3.
func TestExitCodeCarryVeto(t *testing.T) {
	veto := proto.HookReport{Name: "w", Error: `resource "w" before-checkpoint: would carry 3 records into the image`, CarryVeto: true}
	other := proto.HookReport{Name: "db", Error: `resource "db" before-checkpoint: boom`}
	if c := exitCode(&proto.HookFailure{Reports: []proto.HookReport{veto}}); c != exitCarried {
		t.Errorf("veto: exit %d, want %d", c, exitCarried)
	}
	if c := exitCode(&proto.HookFailure{Reports: []proto.HookReport{veto, other}}); c != exitHooks {
		t.Errorf("veto and failure: exit %d, want %d", c, exitHooks)
	}
}
