package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"
)

// normalize maps the values that JSON cannot tell apart under omitempty
// (an empty slice or map and a nil one) to nil.
func normalize(m Message) Message {
	if len(m.Resources) == 0 {
		m.Resources = nil
	}
	if len(m.Reports) == 0 {
		m.Reports = nil
	} else {
		reps := make([]HookReport, len(m.Reports))
		for i, r := range m.Reports {
			if len(r.Details) == 0 {
				r.Details = nil
			}
			reps[i] = r
		}
		m.Reports = reps
	}
	return m
}

func addSeeds(f *testing.F) {
	for _, m := range allMessages() {
		frame, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame[4:])
	}
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `{"v":1}`, `{"v":1,"type":"hello"}`, `{"V":1,"TYPE":"hello"}`,
		`{"v":1,"type":"info","resources":[]}`,
		`{"v":1,"type":"done","reports":[{"name":"x","details":{}}]}`,
		`{"v":1,"type":"done","reports":[{"name":"x","details":{"a":[{},[],null,-0,1e308]}}]}`,
		`{"v":1,"type":"error","error":"\ud800 \xff <>&"}`,
		`{"v":1,"type":"checkpoint","hook_budget_ns":9223372036854775807}`,
		`{"v":1,"type":"checkpoint","hook_budget_ns":-1}`,
		`{"v":1,"v":2,"type":"hello"}`,
		`{"v":1.0,"type":"hello"}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to a
// frame that decodes to the same message and re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := Decode(body)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) && !errors.Is(err, ErrBadVersion) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Decode error %v wraps none of the package's errors", err)
			}
			return
		}
		if m.V != Version || !knownType(m.Type) || m.HookBudget < 0 || m.ResumeAfter < 0 || m.Wait < 0 {
			t.Fatalf("Decode accepted an invalid message %+v", m)
		}
		frame, err := Encode(m)
		if err != nil {
			// JSON escaping can make a near-MaxFrame body grow past it.
			if errors.Is(err, ErrTooLarge) {
				return
			}
			t.Fatalf("Encode of an accepted message %+v: %v", m, err)
		}
		m2, err := Read(bytes.NewReader(frame))
		if err != nil {
			t.Fatalf("re-encoded frame %q does not decode: %v", frame, err)
		}
		if !reflect.DeepEqual(normalize(m), normalize(m2)) {
			t.Fatalf("round trip changed the message:\n%#v\n%#v", m, m2)
		}
		frame2, err := Encode(m2)
		if err != nil || !bytes.Equal(frame, frame2) {
			t.Fatalf("encoding is not stable:\n%q\n%q (%v)", frame, frame2, err)
		}
	})
}

// FuzzRead: Read never panics on any byte stream, never returns a message
// together with an error, and keeps its size limit.
func FuzzRead(f *testing.F) {
	for _, m := range allMessages() {
		frame, _ := Encode(m)
		f.Add(frame)
		f.Add(frame[:len(frame)/2])
	}
	f.Add(binary.BigEndian.AppendUint32(nil, MaxFrame+1))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, '{'})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		m, err := Read(r)
		if err != nil {
			if !reflect.DeepEqual(m, Message{}) {
				t.Fatalf("Read returned %+v with error %v", m, err)
			}
			return
		}
		n := binary.BigEndian.Uint32(data)
		if n > MaxFrame || int(n) != len(data)-4-r.Len() {
			t.Fatalf("Read accepted a frame of %d bytes from %d", n, len(data))
		}
		if _, err := Decode(data[4 : 4+n]); err != nil {
			t.Fatalf("Read accepted what Decode refuses: %v", err)
		}
	})
}

var types = []string{TypeHello, TypeCheckpoint, TypeResume, TypeRestored, TypeInfo, TypeReady, TypeFailed, TypeBusy, TypeDone, TypeError}

// FuzzEncode builds messages from fuzzed fields: every one that Encode
// accepts must come back from Read unchanged (byte-level fuzzing of Decode
// seldom gets past the JSON grammar, so this covers the accepted side).
func FuzzEncode(f *testing.F) {
	f.Add(uint8(0), "", "", "", uint64(0), int64(0), 0, false)
	f.Add(uint8(5), "leave-running", "db", "resource \"db\": <boom> & \u2028", uint64(7), int64(1e9), 42, true)
	f.Fuzz(func(t *testing.T, typ uint8, reason, name, msg string, gen uint64, dur int64, pid int, leave bool) {
		if dur < 0 {
			dur = -(dur + 1)
		}
		m := Message{
			V: Version, Type: types[int(typ)%len(types)],
			HookBudget: Duration(dur), ResumeAfter: Duration(dur / 2), Wait: Duration(dur / 3), Leave: leave,
			Reason: reason, Generation: gen, PID: pid, StartTime: gen / 2,
			Resources: []string{name, reason}, State: name, InstanceID: reason, Error: msg, AppGeneration: gen ^ 1,
			Reports: []HookReport{{Name: name, Duration: Duration(dur), Error: msg,
				Details: map[string]any{name: msg, "n": float64(pid), "list": []any{reason, true, nil}}}},
		}
		frame, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		got, err := Read(bytes.NewReader(frame))
		if err != nil {
			t.Fatalf("Read of an encoded message: %v", err)
		}
		if !utf8.ValidString(reason) || !utf8.ValidString(name) || !utf8.ValidString(msg) {
			return // JSON replaces invalid UTF-8 with U+FFFD
		}
		if !reflect.DeepEqual(normalize(got), normalize(m)) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
		}
	})
}
