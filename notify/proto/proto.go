// Package proto is the contract between the app (package notify) and kcr
// (package client): the wire format of the control socket, length-prefixed
// JSON frames with a protocol version and bounded sizes, and everything else
// both sides must agree on: the socket's name, the defaults, the hook phases
// and the hook-failure error.
//
// A frame is a 4-byte big-endian length followed by that many bytes of JSON.
// Every message carries "v" (the protocol version) and "type".
package proto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Version is the protocol version spoken by this kcr.
const Version = 1

// MaxFrame bounds a frame's payload so that a peer cannot make the other side
// allocate without limit.
const MaxFrame = 1 << 20

// MaxEntries bounds the number of resources and of reports in a message.
const MaxEntries = 4096

// Message types.
const (
	// CLI to app.
	TypeHello      = "hello"      // who are you; answered with TypeInfo
	TypeCheckpoint = "checkpoint" // run before-checkpoint hooks; answered with TypeReady, TypeFailed or TypeBusy
	TypeResume     = "resume"     // the checkpoint is over and this process goes on; answered with TypeDone
	TypeRestored   = "restored"   // this process was restored from an image; answered with TypeDone
	TypeActivity   = "activity"   // how busy are you; answered with TypeInfo and its activity fields

	// App to CLI.
	TypeInfo   = "info"
	TypeReady  = "ready"
	TypeFailed = "failed"
	TypeBusy   = "busy"
	TypeDone   = "done"
	TypeError  = "error"
)

// Errors returned by Read and Decode.
var (
	ErrTooLarge   = errors.New("control message too large")
	ErrBadVersion = errors.New("unsupported control protocol version")
	ErrBadMessage = errors.New("malformed control message")
)

// Duration marshals as integer nanoseconds.
type Duration = time.Duration

// HookReport describes one resource's hook run.
type HookReport struct {
	Name string `json:"name"` // the resource's registered name
	// Phase is the hook phase the report is for; empty from an app that
	// predates it (read as before-checkpoint).
	Phase    Phase          `json:"phase,omitempty"`
	Duration Duration       `json:"duration_ns"`       // the hook's run time
	Error    string         `json:"error,omitempty"`   // the hook's error, "" if it succeeded
	Details  map[string]any `json:"details,omitempty"` // the resource's CheckpointReport
	// Carried is how many records the resource leaves in memory, to be
	// sent after the restore: they are part of the image.
	Carried int64 `json:"records_carried,omitempty"`
	// CarryVeto is set when the hook failed because it would carry records
	// (notify.CarryError): the checkpoint asked for none, or the resource
	// never carries any.
	CarryVeto bool `json:"carry_veto,omitempty"`
}

// Message is the union of all control messages. Fields that do not apply to
// a type are left zero.
type Message struct {
	V    int    `json:"v"`    // the protocol Version
	Type string `json:"type"` // one of the Type constants

	// checkpoint
	HookBudget  Duration `json:"hook_budget_ns,omitempty"`  // deadline for the before-checkpoint hooks
	ResumeAfter Duration `json:"resume_after_ns,omitempty"` // app resumes on its own if no follow-up comes in this time
	Leave       bool     `json:"leave_running,omitempty"`   // the CLI intends --leave-running
	// RequireDrained asks that no resource carry records into the image
	// (kcr checkpoint --require-drained): a hook that would, vetoes.
	RequireDrained bool `json:"require_drained,omitempty"`
	// KCRPID and KCRStart name the CLI: its PID as /proc shows it and its
	// start time. An app in a PID namespace of its own ("kcr run") gets PID
	// 0 from SO_PEERCRED but shares the host's /proc, so it watches this
	// process instead, to resume at once if kcr dies.
	KCRPID   int    `json:"kcr_pid,omitempty"`
	KCRStart uint64 `json:"kcr_start_time,omitempty"`

	// resume, restored
	Reason     string   `json:"reason,omitempty"`     // why, for the app's logs
	Generation uint64   `json:"generation,omitempty"` // restored: the generation kcr gave this restore
	Name       string   `json:"name,omitempty"`       // restored: the clone's name (kcr restore --name)
	Wait       Duration `json:"wait_ns,omitempty"`    // how long the CLI waits for TypeDone

	// info, ready, failed, done
	PID       int          `json:"pid,omitempty"`
	StartTime uint64       `json:"start_time,omitempty"` // task start time from /proc/self/stat
	Resources []string     `json:"resources,omitempty"`  // info: the registered resources
	Reports   []HookReport `json:"reports,omitempty"`    // ready, failed, done: the hooks' reports
	// State is the app's cycle state (info). Done messages also carry the
	// event kind here, for CLIs that predate Kind.
	State string `json:"state,omitempty"`
	// Kind is the after-restore event's kind (done): KindResume or
	// KindRestore.
	Kind          string `json:"kind,omitempty"`
	InstanceID    string `json:"instance_id,omitempty"`    // info, done: the app's current instance id
	Error         string `json:"error,omitempty"`          // failed, done, error: what went wrong
	AppGeneration uint64 `json:"app_generation,omitempty"` // info, done: the generation the app runs as

	// info, in answer to activity (see notify.Activity). An app whose
	// notify library predates TypeActivity answers it with TypeError.
	Activity      uint64 `json:"activity,omitempty"`        // work counter: records fetched, produced, committed; touches; dials
	OpenConns     int    `json:"open_conns,omitempty"`      // tracked connections open now
	HooksInFlight bool   `json:"hooks_in_flight,omitempty"` // a checkpoint cycle's hooks are running
}

// Encode returns the frame for m, filling in the protocol version.
func Encode(m Message) ([]byte, error) {
	m.V = Version
	// Never send what Decode refuses.
	if len(m.Reports) > MaxEntries || len(m.Resources) > MaxEntries {
		return nil, fmt.Errorf("encode %s message: %d reports, %d resources (limit %d): %w", m.Type, len(m.Reports), len(m.Resources), MaxEntries, ErrTooLarge)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s message: %w", m.Type, err)
	}
	if len(body) > MaxFrame {
		return nil, fmt.Errorf("encode %s message: %d bytes: %w", m.Type, len(body), ErrTooLarge)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	return frame, nil
}

// Write writes m as one frame.
func Write(w io.Writer, m Message) error {
	frame, err := Encode(m)
	if err != nil {
		return err
	}
	_, err = w.Write(frame)
	return err
}

// Read reads one frame from r and decodes it.
func Read(r io.Reader) (Message, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Message{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return Message{}, fmt.Errorf("read frame of %d bytes (limit %d): %w", n, MaxFrame, ErrTooLarge)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Message{}, fmt.Errorf("read frame body: %w", err)
	}
	return Decode(body)
}

// Decode parses and validates a frame body.
func Decode(body []byte) (Message, error) {
	if len(body) > MaxFrame {
		return Message{}, ErrTooLarge
	}
	var m Message
	if err := json.Unmarshal(body, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if m.V != Version {
		return Message{}, fmt.Errorf("%w: peer speaks version %d, this kcr speaks %d: use the same kcr version as the app's notify library", ErrBadVersion, m.V, Version)
	}
	if !knownType(m.Type) {
		return Message{}, fmt.Errorf("%w: %w %q", ErrBadMessage, ErrUnknownType, m.Type)
	}
	if m.KCRPID < 0 {
		return Message{}, fmt.Errorf("%w: negative kcr_pid", ErrBadMessage)
	}
	if m.HookBudget < 0 || m.ResumeAfter < 0 || m.Wait < 0 {
		return Message{}, fmt.Errorf("%w: negative duration", ErrBadMessage)
	}
	if m.OpenConns < 0 {
		return Message{}, fmt.Errorf("%w: negative open_conns", ErrBadMessage)
	}
	if len(m.Reports) > MaxEntries || len(m.Resources) > MaxEntries {
		return Message{}, fmt.Errorf("%w: too many entries", ErrBadMessage)
	}
	return m, nil
}

func knownType(t string) bool {
	switch t {
	case TypeHello, TypeCheckpoint, TypeResume, TypeRestored, TypeActivity,
		TypeInfo, TypeReady, TypeFailed, TypeBusy, TypeDone, TypeError:
		return true
	}
	return false
}
