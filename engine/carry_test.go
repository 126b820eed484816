package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

func carrying(n int64, leave bool) *images.Manifest {
	m := &images.Manifest{Options: images.Options{LeaveRunning: leave}}
	AddResources(m, []proto.HookReport{{Name: "db"}, {Name: "kafka-writer/t", Carried: n}})
	return m
}

// Restores that would send carried records again are refused unless
// allowed; the error names the flag, the count and the resource.
func TestCheckDuplicates(t *testing.T) {
	for _, c := range []struct {
		m      *images.Manifest
		count  int
		allow  bool
		refuse string
	}{
		{carrying(5, false), 1, false, ""},
		{carrying(5, false), 2, false, "--count 2 would send each one 2 times"},
		{carrying(5, false), 2, true, ""},
		{carrying(5, true), 1, false, "--leave-running"},
		{carrying(5, true), 3, false, "4 copies"},
		{carrying(5, true), 1, true, ""},
		{carrying(0, true), 3, false, ""},
	} {
		err := CheckDuplicates("img", c.m, c.count, c.allow)
		if c.refuse == "" {
			if err != nil {
				t.Errorf("carried %d leave=%v count %d allow=%v: %v, want no refusal", c.m.RecordsCarried, c.m.Options.LeaveRunning, c.count, c.allow, err)
			}
			continue
		}
		if !errors.Is(err, ErrDuplicates) {
			t.Errorf("carried %d leave=%v count %d: %v, want ErrDuplicates", c.m.RecordsCarried, c.m.Options.LeaveRunning, c.count, err)
			continue
		}
		for _, want := range []string{c.refuse, "--allow-duplicates", "5 records", "kafka-writer/t 5"} {
			if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line with %q", err, want)
			}
		}
	}
}

// The manifest keeps the carried count of each resource and the total.
func TestAddResourcesCarried(t *testing.T) {
	m := &images.Manifest{}
	AddResources(m, []proto.HookReport{{Name: "a", Carried: 2}, {Name: "b"}, {Name: "c", Carried: 3}})
	if m.RecordsCarried != 5 || m.Resources[0].RecordsCarried != 2 || m.Resources[2].RecordsCarried != 3 {
		t.Errorf("manifest carried %d, resources %+v", m.RecordsCarried, m.Resources)
	}
}

// A checkpoint refused only by carry vetoes is told apart from other hook
// failures.
func TestHookErrorCarryVeto(t *testing.T) {
	veto := proto.HookReport{Name: "w", Error: `resource "w" before-checkpoint: would carry 3 records into the image`, CarryVeto: true, Carried: 3}
	other := proto.HookReport{Name: "db", Error: `resource "db" before-checkpoint: boom`}
	resumed := proto.HookReport{Name: "db", Phase: proto.PhaseAfterRestore, Error: `resource "db" after-restore: late`}
	if e := (&proto.HookFailure{Reports: []proto.HookReport{veto, {Name: "ok"}, resumed}}); !e.CarryVeto() || !strings.Contains(e.Error(), "would carry 3 records") {
		t.Errorf("veto alone: CarryVeto %v, %q", e.CarryVeto(), e.Error())
	}
	if e := (&proto.HookFailure{Reports: []proto.HookReport{veto, other}}); e.CarryVeto() {
		t.Error("a veto beside another failure counts as a veto only")
	}
	if e := (&proto.HookFailure{Msg: "x"}); e.CarryVeto() {
		t.Error("no reports counts as a veto")
	}
}

// An image written before kcr recorded carried records is judged by the
// Writer's own report in it.
func TestCheckDuplicatesOlderImage(t *testing.T) {
	m := &images.Manifest{Resources: []images.ResourceReport{
		{Name: "kafka-writer/t", Details: map[string]any{"phase": "before-checkpoint", "records_carried": float64(4)}},
		{Name: "other", Details: map[string]any{"phase": "after-restore", "records_carried": float64(9)}},
	}}
	err := CheckDuplicates("img", m, 2, false)
	if !errors.Is(err, ErrDuplicates) || !strings.Contains(err.Error(), "carries 4 records (kafka-writer/t 4)") {
		t.Errorf("older image carrying 4: %v", err)
	}
}

// Records a consumer had handed to the application and not committed are
// processed by every copy: restoring more than one is refused like for
// carried records, and the error says so.
func TestCheckDuplicatesInApp(t *testing.T) {
	m := &images.Manifest{Resources: []images.ResourceReport{
		{Name: "kafka-reader/g", Details: map[string]any{"phase": "before-checkpoint", "records_in_app": float64(3)}},
	}}
	if err := CheckDuplicates("img", m, 1, false); err != nil {
		t.Errorf("one copy: %v", err)
	}
	if err := CheckDuplicates("img", m, 2, true); err != nil {
		t.Errorf("--allow-duplicates: %v", err)
	}
	err := CheckDuplicates("img", m, 2, false)
	if !errors.Is(err, ErrDuplicates) {
		t.Fatalf("--count 2 with 3 records in the application's hands: %v, want ErrDuplicates", err)
	}
	for _, want := range []string{"kafka-reader/g 3", "handed to the application", "process each one 2 times", "--allow-duplicates"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q: want %q", err, want)
		}
	}
	m.Options.LeaveRunning = true
	if err := CheckDuplicates("img", m, 1, false); !errors.Is(err, ErrDuplicates) {
		t.Errorf("--leave-running image with records in the application's hands: %v, want ErrDuplicates", err)
	}
}
