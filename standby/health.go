package standby

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Health is the answer to a liveness or readiness probe (docs/standby.md,
// "Probes"): kcr standby answers them itself, from its state alone, so that
// a probe never reaches the service, never wakes it and never counts as its
// activity.
type Health struct {
	State State `json:"state"`
	// Live: kcr standby supervises the service (whatever the service
	// does); false only once it stops. Restarting the container would not
	// help in any other state: kcr standby restarts a crashed service
	// itself, with its backoff.
	Live bool `json:"live"`
	// Ready: work sent to the service now is taken, by the service or by
	// a wake: true while it runs, while it is checkpointed or being
	// checkpointed (work wakes it), and while it is restored; false while
	// no service can take it (a cold start, a restart after a crash).
	Ready bool `json:"ready"`
	// Why says what the state means for the probes.
	Why string `json:"why"`
}

// HealthOf is the probes' answer in state st.
func HealthOf(st State) Health {
	h := Health{State: st, Live: true}
	switch st {
	case "":
		h.Why = "kcr standby has not begun supervising"
	case StateStarting:
		h.Why = "the service is starting cold; ready once its control socket answers"
	case StateRunning:
		h.Ready, h.Why = true, "the service runs"
	case StateCheckpointing:
		h.Ready, h.Why = true, "the service is being checkpointed; work that arrives abandons the checkpoint and the service runs on"
	case StateStandby:
		h.Ready, h.Why = true, "the service sleeps; work that arrives wakes it"
	case StateRestoring:
		h.Ready, h.Why = true, "the service is being restored"
	case StateBackoff:
		h.Why = "the service failed; kcr standby restarts it cold after its backoff"
	default: // StateStopped
		h.Live, h.Why = false, "kcr standby stopped"
	}
	return h
}

// DefaultStuckAfter is Options.StuckAfter's default.
const DefaultStuckAfter = 5 * time.Minute

// HealthAt is the probes' answer after in in state st: HealthOf, except
// that a checkpoint or a restore that has lasted longer than stuckAfter
// is stuck (CRIU on a hung volume, say), with the service frozen or not
// there: neither live nor ready, so that the kubelet restarts the
// container, which ends the stuck step and starts the service again.
func HealthAt(st State, in, stuckAfter time.Duration) Health {
	h := HealthOf(st)
	if (st == StateCheckpointing || st == StateRestoring) && in > stuckAfter {
		h.Live, h.Ready = false, false
		h.Why = fmt.Sprintf("%s for %v, longer than %v: stuck (a hung volume or CRIU); a restart of kcr standby ends it", st, in.Round(time.Second), stuckAfter)
	}
	return h
}

// Health returns the probes' answer now.
func (s *Supervisor) Health() Health {
	s.mu.Lock()
	st, since := s.state, s.since
	s.mu.Unlock()
	return HealthAt(st, time.Since(since), s.stuckAfter())
}

// ProbeObserver is an Observer that is also told each probe answered
// (Metrics is one): probe is "healthz" or "readyz".
type ProbeObserver interface {
	Probe(probe string, ok bool)
}

// HealthHandler serves the probes: GET /healthz (liveness) and /readyz
// (readiness), each 200 or 503 with Health as JSON. It reads the state
// under the supervisor's lock, so a supervisor that no longer answers
// fails the probe by its timeout.
func (s *Supervisor) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := s.Health()
		var ok bool
		var probe string
		switch r.URL.Path {
		case "/healthz":
			probe, ok = "healthz", h.Live
		case "/readyz":
			probe, ok = "readyz", h.Ready
		default:
			http.NotFound(w, r)
			return
		}
		if po, is := s.o.Observer.(ProbeObserver); is {
			po.Probe(probe, ok)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(h)
	})
}

// stuckAfter is Options.StuckAfter or its default. It is also the deadline
// of a checkpoint and of a restore: past it the step is cancelled, and its
// CRIU killed if it does not end (criu.KillGrace).
func (s *Supervisor) stuckAfter() time.Duration {
	if s.o.StuckAfter <= 0 {
		return DefaultStuckAfter
	}
	return s.o.StuckAfter
}
