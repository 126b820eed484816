package hookreport

import (
	"encoding/json"
	"reflect"
	"testing"
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

// Map has the keys and values encoding/json gives the struct, and keeps
// the Go types.
func TestMapMatchesJSON(t *testing.T) {
	seven := 7
	for _, v := range []outer{{}, {A: "x", P: &seven, N: 1, Name: "n", inner: &inner{B: 3, C: "c"}}, {inner: &inner{}}} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		m := Map(v)
		if b, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Map(%+v) = %v, want %v", v, got, want)
		}
		if v.inner != nil && m["b"] != v.B {
			t.Errorf("b = %#v, want int64 %d", m["b"], v.B)
		}
	}
	if m := Map((*outer)(nil)); m != nil {
		t.Errorf("Map(nil) = %v, want nil", m)
	}
	var s Slot[outer]
	if _, ok := s.Load(); ok || s.Map() != nil {
		t.Error("empty slot has a report")
	}
	s.Store(outer{A: "y"})
	if r, ok := s.Load(); !ok || r.A != "y" || s.Map()["a"] != "y" {
		t.Errorf("slot = %+v %v, map %v", r, ok, s.Map())
	}
}
