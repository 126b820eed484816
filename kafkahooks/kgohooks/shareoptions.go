package kgohooks

import (
	"errors"
	"time"
)

// HeldPolicy says what a checkpoint does with the records a ShareConsumer's
// application still holds (polled, and not handed back by polling again)
// when the hook's wait for them ends (WithHeldWait).
type HeldPolicy int

const (
	// ReleaseHeld (the default) releases those of them the application
	// has not acknowledged (kgo.AckRelease): the broker hands them to
	// another member at once, with their delivery count raised by one, and
	// the checkpoint goes on. The handler still in flight finishes them in
	// the image; its acknowledgements change nothing, so what it produced
	// for them is produced again by the member that gets them next.
	ReleaseHeld HeldPolicy = iota
	// RefuseHeld refuses the checkpoint (a carry veto: kcr checkpoint exits
	// 10) with ErrRecordsHeld; the consumer goes on, the same member, with
	// its records.
	RefuseHeld
)

// WithHeldPolicy sets what a checkpoint does with records the application
// still holds when the wait for them ends (ShareConsumer only; default
// ReleaseHeld).
func WithHeldPolicy(p HeldPolicy) Opt { return opt(func(c *config) { c.held = p }) }

// WithHeldWait sets how long a checkpoint waits for the application to hand
// back the records it holds by polling again (ShareConsumer only; default
// half the hook budget).
func WithHeldWait(d time.Duration) Opt { return opt(func(c *config) { c.heldWait = d }) }

var (
	// ErrRecordsHeld is the error of a checkpoint refused by RefuseHeld.
	ErrRecordsHeld = errors.New("kgohooks: the application holds share-group records")
	// ErrAcksNotFlushed is the error of a checkpoint refused because the
	// brokers did not confirm the share group's acknowledgements within the
	// hook's budget.
	ErrAcksNotFlushed = errors.New("kgohooks: share-group acknowledgements not confirmed within the checkpoint budget")
)

// ShareReport is what a ShareConsumer reports about its last hook run;
// CheckpointReport gives the same keys as a map, which lands in the image
// manifest. Exactly one of ShareCheckpoint (phase "before-checkpoint") and
// ShareRestore (phase "after-restore") is set.
type ShareReport struct {
	Phase          string `json:"phase"`           // "before-checkpoint" or "after-restore"
	ClientID       string `json:"client_id"`       // the client id sent to brokers then
	Group          string `json:"share_group"`     // the share group
	CallersBlocked int64  `json:"callers_blocked"` // polls waiting at the gate
	DurationMS     int64  `json:"duration_ms"`     // the hook's run time
	*ShareCheckpoint
	*ShareRestore
}

// ShareCheckpoint holds the before-checkpoint part of a ShareReport. A
// refused checkpoint (Error set) stops at the step that failed.
type ShareCheckpoint struct {
	Error string `json:"error,omitempty"` // why the checkpoint was refused
	// RecordsHeld counts the records the application held when the hook
	// began (handed out by its last poll).
	RecordsHeld int64 `json:"records_held"`
	// RecordsReleased counts the records still held when the wait ended,
	// released by ReleaseHeld (those the application had acknowledged
	// keep their acknowledgement).
	RecordsReleased int64 `json:"records_released"`
	AcksFlushed     bool  `json:"acks_flushed"` // the brokers confirmed every acknowledgement
	LeftGroup       bool  `json:"left_group"`   // the member left the share group
	// LeaveError is why the leave failed; the member, holding no record,
	// expires with its session (group.share.session.timeout.ms).
	LeaveError      string `json:"leave_error,omitempty"`
	ConnectionsOpen int    `json:"connections_open"` // broker connections open at the end (0)
}

// ShareRestore holds the after-restore part of a ShareReport.
type ShareRestore struct {
	Event     string `json:"event"`      // "restore" or "resume"
	NewClient bool   `json:"new_client"` // a new kgo client: a new member of the share group
}
