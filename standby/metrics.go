package standby

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is an Observer that keeps Prometheus metrics, namespaced
// kcr_standby_: register it with a prometheus.Registerer.
type Metrics struct {
	state       *prometheus.GaugeVec
	wakes       *prometheus.CounterVec
	wakeLatency prometheus.Histogram
	checkpoint  prometheus.Histogram
	restore     prometheus.Histogram
	failures    *prometheus.CounterVec
	imageBytes  prometheus.Gauge
	coldStarts  *prometheus.CounterVec
	requests    prometheus.Counter
	holds       *prometheus.CounterVec
	phases      *prometheus.HistogramVec
	replicas    *prometheus.CounterVec
	probes      *prometheus.CounterVec
}

var allStates = []State{StateStarting, StateRunning, StateCheckpointing, StateStandby, StateRestoring, StateBackoff, StateStopped}

// NewMetrics returns the metrics, registered with reg (serve them with the
// registry's Gatherer, e.g. promhttp.HandlerFor).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := []float64{.025, .05, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10}
	m := &Metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kcr_standby_state",
			Help: "1 for the supervisor's current state, 0 for the others."}, []string{"state"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kcr_standby_wakes_total",
			Help: "Restores of the service, by what woke it (kafka, connection, manual, signal)."}, []string{"source"}),
		wakeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kcr_standby_wake_latency_seconds",
			Help: "From the wake signal to the restored service's after-restore hooks done.", Buckets: latency}),
		checkpoint: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kcr_standby_checkpoint_duration_seconds",
			Help: "Successful checkpoints: hooks, dump and image write.", Buckets: latency}),
		restore: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kcr_standby_restore_duration_seconds",
			Help: "Successful restores: verify, CRIU restore and after-restore hooks.", Buckets: latency}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kcr_standby_failures_total",
			Help: "Failed checkpoints (the service ran on) and restores (it started cold)."}, []string{"op"}),
		imageBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kcr_standby_image_bytes",
			Help: "Size of the newest image."}),
		coldStarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kcr_standby_cold_starts_total",
			Help: "Cold starts of the service, by reason."}, []string{"reason"}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{Name: "kcr_standby_broker_requests_total",
			Help: "Requests kcr standby sent to Kafka brokers to watch the group's lag and hold the group."}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kcr_standby_group_holds_total",
			Help: "Group holds by result: held (the placeholder joined), skipped (nothing to hold), released (it left: a member joined), failed."}, []string{"result"}),
	}
	m.phases = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kcr_standby_wake_phase_seconds",
		Help:    "Time from the wake signal to each phase of a wake: restored (CRIU done), hooks_done (after-restore hooks), first_activity (the service's first record handed or request answered).",
		Buckets: latency}, []string{"phase"})
	m.replicas = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kcr_standby_replica_decisions_total",
		Help: "Changes of a replica's decision (--replicas): started, woken_by_lag, scaled_up, kept_asleep_others_keep_up, kept_asleep_other_waking, asleep_no_work."}, []string{"decision"})
	m.probes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kcr_standby_probes_total",
		Help: "Liveness (healthz) and readiness (readyz) probes kcr standby answered itself, by result (ok, failed): none reached the service."}, []string{"probe", "result"})
	reg.MustRegister(m.state, m.wakes, m.wakeLatency, m.checkpoint, m.restore, m.failures, m.imageBytes, m.coldStarts, m.requests, m.holds, m.phases, m.replicas, m.probes)
	return m
}

// State implements Observer.
func (m *Metrics) State(s State) {
	for _, x := range allStates {
		v := 0.0
		if x == s {
			v = 1
		}
		m.state.WithLabelValues(string(x)).Set(v)
	}
}

// Wake implements Observer.
func (m *Metrics) Wake(source string, latency time.Duration) {
	m.wakes.WithLabelValues(source).Inc()
	m.wakeLatency.Observe(latency.Seconds())
}

// Checkpoint implements Observer.
func (m *Metrics) Checkpoint(d time.Duration, imageBytes int64, err error) {
	if err != nil {
		m.failures.WithLabelValues("checkpoint").Inc()
		return
	}
	m.checkpoint.Observe(d.Seconds())
	m.imageBytes.Set(float64(imageBytes))
}

// Restore implements Observer.
func (m *Metrics) Restore(d time.Duration, err error) {
	if err != nil {
		m.failures.WithLabelValues("restore").Inc()
		return
	}
	m.restore.Observe(d.Seconds())
}

// ColdStart implements Observer.
func (m *Metrics) ColdStart(reason string) { m.coldStarts.WithLabelValues(reason).Inc() }

// BrokerRequests implements Observer.
func (m *Metrics) BrokerRequests(n int) {
	if n > 0 {
		m.requests.Add(float64(n))
	}
}

// GroupHold implements Observer.
func (m *Metrics) GroupHold(result string) { m.holds.WithLabelValues(result).Inc() }

// WakePhase implements PhaseObserver.
func (m *Metrics) WakePhase(phase string, d time.Duration) {
	m.phases.WithLabelValues(phase).Observe(d.Seconds())
}

// ReplicaDecision implements ReplicaObserver.
func (m *Metrics) ReplicaDecision(decision string) { m.replicas.WithLabelValues(decision).Inc() }

// Probe implements ProbeObserver.
func (m *Metrics) Probe(probe string, ok bool) {
	r := "ok"
	if !ok {
		r = "failed"
	}
	m.probes.WithLabelValues(probe, r).Inc()
}
