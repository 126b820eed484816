package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

func allMessages() []Message {
	reports := []HookReport{
		{Name: "db", Duration: 1500 * time.Microsecond, Details: map[string]any{"closed": 3.0, "hosts": []any{"a", "b"}, "nested": map[string]any{"ok": true, "nil": nil}}},
		{Name: "kafka \"main\" ✓", Duration: 0, Error: "resource \"kafka\" before-checkpoint: boom"},
	}
	return []Message{
		{Type: TypeHello},
		{Type: TypeCheckpoint, HookBudget: 10 * time.Second, ResumeAfter: 30 * time.Second, Leave: true},
		{Type: TypeResume, Reason: "dump failed: <criu> & co", Wait: 20 * time.Second},
		{Type: TypeRestored, Generation: 1<<64 - 1, Wait: time.Nanosecond},
		{Type: TypeInfo, PID: 4242, StartTime: 123456789, Resources: []string{"a", "b c", ""}, State: "idle", InstanceID: "00112233445566778899aabbccddeeff", AppGeneration: 3},
		{Type: TypeReady, PID: 1, StartTime: 1, Reports: reports},
		{Type: TypeFailed, Reports: reports, Error: "joined\nerrors"},
		{Type: TypeBusy, Error: "checkpoint already in progress"},
		{Type: TypeDone, PID: 7, Reports: reports[:1], InstanceID: "x", AppGeneration: 9, State: "restore"},
		{Type: TypeError, Error: "permission denied"},
	}
}

func TestRoundTripEveryType(t *testing.T) {
	seen := map[string]bool{}
	var stream bytes.Buffer
	for _, m := range allMessages() {
		seen[m.Type] = true
		frame, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode %s: %v", m.Type, err)
		}
		if n := binary.BigEndian.Uint32(frame); int(n) != len(frame)-4 {
			t.Fatalf("%s: header says %d, body is %d", m.Type, n, len(frame)-4)
		}
		got, err := Decode(frame[4:])
		if err != nil {
			t.Fatalf("Decode %s: %v", m.Type, err)
		}
		want := m
		want.V = Version
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s round trip:\n got %#v\nwant %#v", m.Type, got, want)
		}
		if err := Write(&stream, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, typ := range []string{TypeHello, TypeCheckpoint, TypeResume, TypeRestored, TypeInfo, TypeReady, TypeFailed, TypeBusy, TypeDone, TypeError} {
		if !seen[typ] {
			t.Errorf("type %s not covered", typ)
		}
	}
	// The same messages back to back on one stream.
	for _, m := range allMessages() {
		got, err := Read(&stream)
		if err != nil {
			t.Fatalf("Read %s: %v", m.Type, err)
		}
		if got.Type != m.Type {
			t.Fatalf("Read %s, want %s", got.Type, m.Type)
		}
	}
	if _, err := Read(&stream); err != io.EOF {
		t.Fatalf("Read at the end of the stream: %v, want io.EOF", err)
	}
}

func TestEncodeSetsVersion(t *testing.T) {
	frame, err := Encode(Message{V: 42, Type: TypeHello})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(frame, []byte(`"v":1`)) {
		t.Fatalf("frame %q", frame)
	}
}

func TestEncodeTooLarge(t *testing.T) {
	_, err := Encode(Message{Type: TypeError, Error: strings.Repeat("x", MaxFrame)})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	if err := Write(io.Discard, Message{Type: TypeError, Error: strings.Repeat("x", MaxFrame)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Write: %v", err)
	}
}

func TestEncodeTooManyEntries(t *testing.T) {
	// Encode must not produce what Decode refuses.
	if _, err := Encode(Message{Type: TypeFailed, Reports: make([]HookReport, MaxEntries+1)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("reports: %v", err)
	}
	if _, err := Encode(Message{Type: TypeInfo, Resources: make([]string, MaxEntries+1)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("resources: %v", err)
	}
	frame, err := Encode(Message{Type: TypeInfo, Resources: make([]string, MaxEntries)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(frame[4:]); err != nil {
		t.Fatalf("MaxEntries resources: %v", err)
	}
}

// headerOnly serves a frame header and fails any read past it, so Read must
// reject the frame from the header alone.
type headerOnly struct {
	hdr  []byte
	over bool
}

func (h *headerOnly) Read(p []byte) (int, error) {
	if len(h.hdr) == 0 {
		h.over = true
		return 0, errors.New("read past the header")
	}
	n := copy(p, h.hdr)
	h.hdr = h.hdr[n:]
	return n, nil
}

func TestReadOversizedFrameWithoutAllocating(t *testing.T) {
	for _, n := range []uint32{MaxFrame + 1, 1<<32 - 1} {
		r := &headerOnly{hdr: binary.BigEndian.AppendUint32(nil, n)}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := Read(r)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%d-byte frame: err = %v, want ErrTooLarge", n, err)
		}
		if r.over {
			t.Errorf("%d-byte frame: Read went past the header", n)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
			t.Errorf("%d-byte frame: allocated %d bytes", n, alloc)
		}
	}
	// MaxFrame itself is allowed (and then fails on the short body).
	r := bytes.NewReader(binary.BigEndian.AppendUint32(nil, MaxFrame))
	if _, err := Read(r); errors.Is(err, ErrTooLarge) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("MaxFrame-sized frame with no body: %v", err)
	}
	if _, err := Decode(make([]byte, MaxFrame+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Decode of an oversized body: %v", err)
	}
}

func frame(body string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func TestReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input []byte
		want  error
		text  string
	}{
		{"empty stream", nil, io.EOF, ""},
		{"short header", []byte{0, 0}, io.ErrUnexpectedEOF, ""},
		{"truncated body", append(binary.BigEndian.AppendUint32(nil, 50), `{"v":1,"type":"hel`...), io.ErrUnexpectedEOF, "read frame body"},
		{"header only", binary.BigEndian.AppendUint32(nil, 10), io.ErrUnexpectedEOF, ""},
		{"empty body", frame(""), ErrBadMessage, ""},
		{"not json", frame("hello"), ErrBadMessage, ""},
		{"json array", frame(`[1,2]`), ErrBadMessage, ""},
		{"null", frame(`null`), ErrBadVersion, ""},
		{"no version", frame(`{"type":"hello"}`), ErrBadVersion, "version 0"},
		{"wrong version", frame(`{"v":2,"type":"hello"}`), ErrBadVersion, "version 2"},
		{"unknown type", frame(`{"v":1,"type":"shutdown"}`), ErrBadMessage, `unknown type "shutdown"`},
		{"no type", frame(`{"v":1}`), ErrBadMessage, "unknown type"},
		{"negative hook budget", frame(`{"v":1,"type":"checkpoint","hook_budget_ns":-1}`), ErrBadMessage, "negative duration"},
		{"negative resume after", frame(`{"v":1,"type":"checkpoint","resume_after_ns":-1000}`), ErrBadMessage, "negative duration"},
		{"negative wait", frame(`{"v":1,"type":"resume","wait_ns":-9223372036854775808}`), ErrBadMessage, "negative duration"},
		{"negative kcr pid", frame(`{"v":1,"type":"checkpoint","kcr_pid":-1}`), ErrBadMessage, "negative kcr_pid"},
		{"wrong field type", frame(`{"v":1,"type":"restored","generation":"7"}`), ErrBadMessage, ""},
		{"negative generation", frame(`{"v":1,"type":"restored","generation":-7}`), ErrBadMessage, ""},
		{"too many resources", frame(`{"v":1,"type":"info","resources":[` + strings.Repeat(`"",`, 4096) + `""]}`), ErrBadMessage, "too many"},
		{"trailing garbage", frame(`{"v":1,"type":"hello"} x`), ErrBadMessage, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Read(bytes.NewReader(tc.input))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Read = %+v, %v; want %v", m, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q does not say %q", err, tc.text)
			}
		})
	}
}

func TestDecodeAcceptsUnknownFields(t *testing.T) {
	// A newer kcr may add fields; the same version must still be read.
	m, err := Decode([]byte(`{"v":1,"type":"hello","future_field":{"x":[1,2]}}`))
	if err != nil || m.Type != TypeHello {
		t.Fatalf("%+v, %v", m, err)
	}
}

func TestDurationsAreNanoseconds(t *testing.T) {
	frame, err := Encode(Message{Type: TypeCheckpoint, HookBudget: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(frame, []byte(`"hook_budget_ns":2000000000`)) {
		t.Fatalf("frame %s", frame[4:])
	}
}

// An unknown type's error is ErrUnknownType, and its text is the one every
// notify version has sent back for a request it does not know: kcr
// recognises an older app by it.
func TestUnknownTypeContract(t *testing.T) {
	_, err := Read(bytes.NewReader(frame(`{"v":1,"type":"activity2"}`)))
	if !errors.Is(err, ErrUnknownType) || !errors.Is(err, ErrBadMessage) {
		t.Fatalf("Read of an unknown type: %v, want ErrBadMessage and ErrUnknownType", err)
	}
	if want := `malformed control message: unknown type "activity2"`; err.Error() != want {
		t.Errorf("error %q, want the contract's %q", err, want)
	}
}
