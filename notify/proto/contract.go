package proto

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// SocketPrefix and SocketSuffix frame the base name of every control socket;
// kcr recognises the socket among a process's fds by them.
const (
	SocketPrefix = "kcr-"
	SocketSuffix = ".sock"
)

// SocketName is the base name of the control socket of the process with
// host PID pid: the name the app binds by default and the one kcr waits for
// after restoring a clone with a new PID.
func SocketName(pid int) string { return SocketPrefix + strconv.Itoa(pid) + SocketSuffix }

// MovedSocketName is the base name a restored clone with the new host PID
// pid moves its socket to from base, bound by the image's process oldPID:
// SocketName(pid) if base was SocketName(oldPID), else base with "-<pid>"
// before the suffix (clones of one image share its path).
func MovedSocketName(base string, oldPID, pid int) string {
	if base == SocketName(oldPID) {
		return SocketName(pid)
	}
	return strings.TrimSuffix(base, SocketSuffix) + "-" + strconv.Itoa(pid) + SocketSuffix
}

// IsSocketName reports whether the base name of path looks like a control
// socket (kcr-NAME.sock, NAME not empty).
func IsSocketName(path string) bool {
	base := filepath.Base(path)
	return len(base) > len(SocketPrefix)+len(SocketSuffix) &&
		strings.HasPrefix(base, SocketPrefix) && strings.HasSuffix(base, SocketSuffix)
}

// Defaults both sides use for a value a request leaves out, and the bounds
// the app holds to whatever the CLI asks.
const (
	// DefaultHookBudget bounds the before-checkpoint hooks.
	DefaultHookBudget = 10 * time.Second
	// DefaultResumeAfter is how long the app waits for kcr's follow-up
	// before it resumes on its own.
	DefaultResumeAfter = 30 * time.Second
	// DefaultMaxSuspend caps how long the app stays suspended.
	DefaultMaxSuspend = 5 * time.Minute
	// DefaultAfterBudget bounds the after-restore hooks.
	DefaultAfterBudget = 30 * time.Second
	// DefaultMaxHookBudget caps the before-checkpoint budget a request may
	// ask for: the app's resources stay quiesced that long.
	DefaultMaxHookBudget = 2 * time.Minute
)

// A Marker is a phrase that every log line and error message of one kind
// of failed checkpoint holds, for those who see only text: kcr reading the
// log of its CRIU action script, or a container runtime's message. Failure
// turns such text back into a HookFailure.
type Marker string

const (
	// FailedMarker begins the error of failed before-checkpoint hooks
	// (HookFailure.Error) and the CRIU action script's log line of one.
	FailedMarker Marker = "before-checkpoint hooks failed"
	// CarryMarker is in the message of every veto of a resource that would
	// carry records into the image (notify.CarryError).
	CarryMarker Marker = "would carry"
)

// In reports whether text holds m.
func (m Marker) In(text string) bool { return strings.Contains(text, string(m)) }

// LastLine returns the last line of text that holds m, trimmed, or "".
func (m Marker) LastLine(text string) string {
	var last string
	for _, l := range strings.Split(text, "\n") {
		if m.In(l) {
			last = strings.TrimSpace(l)
		}
	}
	return last
}

// Failure returns the HookFailure that the last line of text holding m
// reports, or nil if no line holds m. That line is its message; with
// CarryMarker it is also the carry veto of resource, the one report (the
// action script keeps no reports when it refuses: its line names the
// resource and the count).
func (m Marker) Failure(text, resource string) *HookFailure {
	line := m.LastLine(text)
	switch {
	case line == "":
		return nil
	case m == CarryMarker:
		return &HookFailure{Reports: []HookReport{{Name: resource, Error: line, CarryVeto: true}}, Msg: line}
	}
	return &HookFailure{Msg: line}
}

// ResumeAfterFor is kcr's default for how long an app whose hooks had
// hookBudget waits for kcr's follow-up before it resumes on its own: the
// budget and a minute for CRIU's dump. The CLI and the CRIU action script
// both ask for it.
func ResumeAfterFor(hookBudget time.Duration) time.Duration {
	return hookBudget + time.Minute
}

// ErrBusy is returned when a checkpoint is requested while one is running.
var ErrBusy = errors.New("checkpoint already in progress")

// ErrUnknownType is Decode's error, under ErrBadMessage, for a message type
// this side does not know: an app whose notify library is older than the
// kcr asking refuses a newer request with it. Its error reply's text,
// "malformed control message: unknown type \"T\"", is the contract (every
// version sends it), and package client turns it back into an error that
// wraps ErrUnknownType.
var ErrUnknownType = errors.New("unknown type")

// ErrNoProcess is returned for a PID that does not exist (or is a zombie).
var ErrNoProcess = errors.New("no such process")

// Phase names the hook phase a report belongs to.
type Phase string

// Hook phases.
const (
	PhaseBeforeCheckpoint Phase = "before-checkpoint"
	PhaseAfterRestore     Phase = "after-restore"
)

// Kinds of an after-restore event, as carried in Message.Kind.
const (
	KindResume  = "resume"
	KindRestore = "restore"
)

// EventKind returns the kind of a done message: Kind, or State for an app
// that predates the Kind field and sent the kind there.
func (m Message) EventKind() string {
	if m.Kind != "" || m.Type != TypeDone {
		return m.Kind
	}
	return m.State
}

// HookFailure is a failed checkpoint as the app reported it (TypeFailed):
// the before-checkpoint hooks did not all succeed, nothing was dumped and
// the app resumed every resource. It is kcr's one hook-failure error: of
// engine.Checkpoint, of kcr's CRIU action script (the failed processes'
// reports, Msg naming each PID) and of a container checkpoint.
type HookFailure struct {
	Reports []HookReport // every hook's report, failed or not
	Msg     string       // the app's error message
}

// Failed returns the reports of before-checkpoint hooks that failed.
func (e *HookFailure) Failed() []HookReport {
	var out []HookReport
	for _, r := range e.Reports {
		if r.Error != "" && r.Phase != PhaseAfterRestore {
			out = append(out, r)
		}
	}
	return out
}

// CarryVeto reports whether every before-checkpoint hook that failed did so
// because it would carry records into the image (notify.CarryError).
func (e *HookFailure) CarryVeto() bool {
	failed := e.Failed()
	for _, r := range failed {
		if !r.CarryVeto {
			return false
		}
	}
	return len(failed) > 0
}

// Error joins the errors of the failed hooks (Msg if none is listed).
func (e *HookFailure) Error() string {
	var msgs []string
	for _, r := range e.Failed() {
		msgs = append(msgs, r.Error)
	}
	if len(msgs) == 0 {
		msgs = []string{e.Msg}
	}
	return string(FailedMarker) + ", nothing was dumped, the app resumed: " + strings.Join(msgs, "; ")
}

// Fit returns m cut down so that Encode accepts it, keeping what matters
// most: at most MaxEntries reports (the failed ones first) and resources,
// without report details, every string cut to share the frame. If even that
// is too large, only the identity fields and a cut error remain.
func Fit(m Message) Message {
	if _, err := Encode(m); err == nil {
		return m
	}
	if len(m.Resources) > MaxEntries {
		m.Resources = m.Resources[:MaxEntries]
	}
	if len(m.Reports) > MaxEntries {
		keep := make([]bool, len(m.Reports))
		n := 0
		for pass := 0; pass < 2; pass++ {
			for i, r := range m.Reports {
				if n < MaxEntries && !keep[i] && (pass == 1 || r.Error != "") {
					keep[i] = true
					n++
				}
			}
		}
		var reps []HookReport
		for i, r := range m.Reports {
			if keep[i] {
				reps = append(reps, r)
			}
		}
		m.Reports = reps
	}
	// Room for every string even if JSON escaping makes it 6 times longer.
	n := max(64, MaxFrame/(8*(2+2*len(m.Reports)+len(m.Resources))))
	fit := m
	fit.Error = cut(m.Error, n)
	fit.Reason = cut(m.Reason, n)
	fit.Resources = make([]string, len(m.Resources))
	for i, r := range m.Resources {
		fit.Resources[i] = cut(r, n)
	}
	fit.Reports = make([]HookReport, len(m.Reports))
	for i, r := range m.Reports {
		fit.Reports[i] = HookReport{Name: cut(r.Name, n), Phase: r.Phase, Duration: r.Duration, Error: cut(r.Error, n), Carried: r.Carried, CarryVeto: r.CarryVeto}
	}
	if _, err := Encode(fit); err == nil {
		return fit
	}
	return Message{Type: m.Type, PID: m.PID, StartTime: m.StartTime, State: m.State, Kind: m.Kind,
		InstanceID: m.InstanceID, AppGeneration: m.AppGeneration, Error: cut(m.Error, 4<<10)}
}

// cut shortens s to about n bytes on a rune boundary, saying so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "… (truncated)"
}
