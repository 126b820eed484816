package proto

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestSocketName(t *testing.T) {
	if got := SocketName(42); got != "kcr-42.sock" {
		t.Fatalf("SocketName(42) = %q", got)
	}
	for path, want := range map[string]bool{
		"/run/kcr/kcr-42.sock": true, "kcr-app.sock": true,
		"/run/kcr/kcr-.sock": false, "/run/kcr/app.sock": false, "/tmp/kcr-1.socket": false, "/tmp/kcr-1.sock/x": false,
	} {
		if got := IsSocketName(path); got != want {
			t.Errorf("IsSocketName(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestMovedSocketName(t *testing.T) {
	if got := MovedSocketName("kcr-10.sock", 10, 42); got != "kcr-42.sock" {
		t.Errorf("own name: %q", got)
	}
	if got := MovedSocketName("kcr-app.sock", 10, 42); got != "kcr-app-42.sock" || !IsSocketName(got) {
		t.Errorf("chosen name: %q", got)
	}
}

// A done message from an app that predates Kind still says its kind, and a
// new app's Kind wins.
func TestEventKindBackwardCompatible(t *testing.T) {
	var old Message
	if err := json.Unmarshal([]byte(`{"v":1,"type":"done","state":"restore"}`), &old); err != nil {
		t.Fatal(err)
	}
	if k := old.EventKind(); k != KindRestore {
		t.Errorf("old done: kind %q", k)
	}
	if k := (Message{Type: TypeDone, State: "resume", Kind: KindRestore}).EventKind(); k != KindRestore {
		t.Errorf("new done: kind %q", k)
	}
	if k := (Message{Type: TypeInfo, State: "idle"}).EventKind(); k != "" {
		t.Errorf("info: kind %q, want none", k)
	}
	b, _ := Encode(Message{Type: TypeDone, State: KindResume, Kind: KindResume})
	if !strings.Contains(string(b), `"kind":"resume"`) || !strings.Contains(string(b), `"state":"resume"`) {
		t.Errorf("done frame %s lacks kind or state", b[4:])
	}
}

// The carry veto is judged by the reports' phase, not by their text.
func TestHookFailurePhase(t *testing.T) {
	veto := HookReport{Name: "w", Phase: PhaseBeforeCheckpoint, Error: "would carry 3 records", CarryVeto: true}
	// An after-restore failure whose text looks like a before one.
	after := HookReport{Name: "db", Phase: PhaseAfterRestore, Error: `resource "db" before-checkpoint: boom`}
	e := &HookFailure{Reports: []HookReport{veto, after}, Msg: "m"}
	if !e.CarryVeto() || strings.Contains(e.Error(), "boom") {
		t.Errorf("CarryVeto %v, %q", e.CarryVeto(), e.Error())
	}
	if e := (&HookFailure{Msg: "m"}); e.CarryVeto() || !strings.HasSuffix(e.Error(), ": m") {
		t.Errorf("no reports: CarryVeto %v, %q", e.CarryVeto(), e.Error())
	}
}

func TestFit(t *testing.T) {
	small := Message{Type: TypeFailed, Error: "x", Reports: []HookReport{{Name: "a", Details: map[string]any{"k": 1}}}}
	if got := Fit(small); got.Reports[0].Details == nil {
		t.Error("Fit changed a message that fits")
	}
	reps := make([]HookReport, MaxEntries+10)
	for i := range reps {
		reps[i] = HookReport{Name: strings.Repeat("n", 300), Phase: PhaseBeforeCheckpoint, Details: map[string]any{"big": strings.Repeat("d", 1000)}}
	}
	reps[len(reps)-1].Error = "the failure"
	m := Fit(Message{Type: TypeFailed, Error: strings.Repeat("é", MaxFrame), Reports: reps})
	if _, err := Encode(m); err != nil {
		t.Fatalf("Fit result does not encode: %v", err)
	}
	last := m.Reports[len(m.Reports)-1]
	if len(m.Reports) != MaxEntries || last.Error != "the failure" || last.Phase != PhaseBeforeCheckpoint || m.Reports[0].Details != nil {
		t.Errorf("%d reports, last %+v: want the failed one kept, details dropped", len(m.Reports), last)
	}
	if !strings.HasSuffix(m.Error, "… (truncated)") {
		t.Errorf("error not cut: ...%q", m.Error[len(m.Error)-20:])
	}
}

// A marker's last line in a log is its typed failure: a carry veto of the
// named resource, or a failed-hooks message; text without it is no failure.
func TestMarkerFailure(t *testing.T) {
	log := "(00.1) pre-dump\n(00.2) kafka-writer/t: would carry 2 records into the image\n(00.3) kafka-writer/u: would carry 3 records into the image \n(00.4) Error (criu/action-scripts.c:60): One of more action scripts failed\n"
	he := CarryMarker.Failure(log, "container c")
	if he == nil || !he.CarryVeto() || he.Msg != "(00.3) kafka-writer/u: would carry 3 records into the image" || he.Reports[0].Name != "container c" {
		t.Errorf("carry veto: %#v", he)
	}
	if he := FailedMarker.Failure(log, ""); he != nil {
		t.Errorf("no failed-hooks line, got %#v", he)
	}
	err := (&HookFailure{Msg: "PID 7: no"}).Error()
	if !FailedMarker.In(err) || !strings.HasPrefix(err, string(FailedMarker)) {
		t.Errorf("HookFailure's error %q does not begin with FailedMarker", err)
	}
	he = FailedMarker.Failure("a\n"+err+"\nb", "")
	if he == nil || he.Msg != err || he.CarryVeto() {
		t.Errorf("failed hooks: %#v", he)
	}
}
