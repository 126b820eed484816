package hookreport_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kcr-dev/kcr/internal/hookreport"
	"github.com/kcr-dev/kcr/kafkahooks"
	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
)

type inner struct {
	B int64  `json:"b"`
	C string `json:"c,omitempty"`
}

type outer struct {
	A    string `json:"a"`
	P    *int   `json:"p,omitempty"`
	N    int    `json:"-"`
	Name string
	*inner
}

// Map has the keys and values encoding/json gives the struct, for the
// reports of kafkahooks and kgohooks too: godoc's keys are the manifest's.
func TestMapMatchesJSON(t *testing.T) {
	seven, next := 7, int64(42)
	reports := []any{
		outer{}, outer{A: "x", P: &seven, N: 1, Name: "n", inner: &inner{B: 3, C: "c"}}, outer{inner: &inner{}},
		kafkahooks.WriterReport{Phase: "before-checkpoint", ClientID: "c", RecordsCarried: 3, WriterCheckpoint: &kafkahooks.WriterCheckpoint{RecordsPending: 5, ConnectionsClosed: 2}},
		kafkahooks.WriterReport{Phase: "after-restore", WriterRestore: &kafkahooks.WriterRestore{Event: "restore", GateOpen: true, RecordsFailed: 1}},
		kafkahooks.ReaderReport{Phase: "before-checkpoint", NextOffset: &next, ReaderCheckpoint: &kafkahooks.ReaderCheckpoint{Group: ""}},
		kafkahooks.ReaderReport{Phase: "before-checkpoint", ReaderCheckpoint: &kafkahooks.ReaderCheckpoint{Group: "g", GroupCheckpoint: &kafkahooks.GroupCheckpoint{CommitError: "x", StaleCommits: 4}}},
		kafkahooks.ReaderReport{Phase: "after-restore", Event: "resume"},
		kgohooks.Report{Phase: "before-checkpoint", Checkpoint: &kgohooks.Checkpoint{Transaction: "none", NextOffsets: map[string]int64{"t/0": 4},
			GroupCheckpoint: &kgohooks.GroupCheckpoint{Group: "g"}, KeptClient: &kgohooks.KeptClient{KeptForResume: true}}},
		kgohooks.Report{Phase: "after-restore", Restore: &kgohooks.Restore{Event: "restore", NewClient: true}},
	}
	for _, rep := range reports {
		b, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if b, err = json.Marshal(hookreport.Map(rep)); err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Map(%T) = %v, want %v", rep, got, want)
		}
	}
	// Go types are kept, for in-process readers such as Simulate.
	if m := hookreport.Map(kafkahooks.WriterReport{RecordsCarried: 3}); m["records_carried"] != int64(3) {
		t.Errorf("records_carried = %#v, want int64(3)", m["records_carried"])
	}
	if m := hookreport.Map((*outer)(nil)); m != nil {
		t.Errorf("Map(nil) = %v, want nil", m)
	}
}

func TestSlot(t *testing.T) {
	var s hookreport.Slot[outer]
	if _, ok := s.Load(); ok || s.Map() != nil {
		t.Error("empty slot has a report")
	}
	s.Store(outer{A: "y"})
	if r, ok := s.Load(); !ok || r.A != "y" || s.Map()["a"] != "y" {
		t.Errorf("slot = %+v %v, map %v", r, ok, s.Map())
	}
}
