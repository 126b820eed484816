package kafkahooks

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/kcr-dev/kcr/internal/hookreport"
)

// The map a report lands in the manifest as must have the keys and values
// encoding/json gives the typed report, so godoc's keys are the manifest's.
func TestReportMapMatchesJSON(t *testing.T) {
	next := int64(42)
	reports := []any{
		WriterReport{Phase: "before-checkpoint", ClientID: "c", RecordsCarried: 3, WriterCheckpoint: &WriterCheckpoint{RecordsPending: 5, ConnectionsClosed: 2}},
		WriterReport{Phase: "after-restore", WriterRestore: &WriterRestore{Event: "restore", GateOpen: true, RecordsFailed: 1}},
		ReaderReport{Phase: "before-checkpoint", NextOffset: &next, ReaderCheckpoint: &ReaderCheckpoint{Group: ""}},
		ReaderReport{Phase: "before-checkpoint", ReaderCheckpoint: &ReaderCheckpoint{Group: "g", GroupCheckpoint: &GroupCheckpoint{CommitError: "x", StaleCommits: 4}}},
		ReaderReport{Phase: "after-restore", Event: "resume"},
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
		b, err = json.Marshal(hookreport.Map(rep))
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("hookreport.Map(%T) = %v, want %v", rep, got, want)
		}
	}
	if m := hookreport.Map(WriterReport{RecordsCarried: 3}); m["records_carried"] != int64(3) {
		t.Errorf("records_carried = %#v, want int64(3)", m["records_carried"])
	}
}
