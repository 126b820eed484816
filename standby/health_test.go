package standby

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Each state's answers, as docs/standby.md ("Probes") defines them: live
// until kcr standby stops; ready whenever work sent now is taken, by the
// service or by a wake.
func TestHealthOf(t *testing.T) {
	want := map[State][2]bool{ // live, ready
		"":                 {true, false},
		StateStarting:      {true, false},
		StateRunning:       {true, true},
		StateCheckpointing: {true, true},
		StateStandby:       {true, true},
		StateRestoring:     {true, true},
		StateBackoff:       {true, false},
		StateStopped:       {false, false},
	}
	for _, st := range allStates {
		if _, ok := want[st]; !ok {
			t.Errorf("state %q has no defined probe answer in this test", st)
		}
	}
	for st, w := range want {
		h := HealthOf(st)
		if h.State != st || h.Live != w[0] || h.Ready != w[1] || h.Why == "" {
			t.Errorf("HealthOf(%q) = %+v, want live %v, ready %v and a reason", st, h, w[0], w[1])
		}
	}
}

// probeCounter is a recorder that also counts the probes it is told of.
type probeCounter struct {
	recorder
	mu     sync.Mutex
	probes map[string]int
}

func (p *probeCounter) Probe(probe string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.probes == nil {
		p.probes = map[string]int{}
	}
	p.probes[probe+map[bool]string{true: " ok", false: " failed"}[ok]]++
}

// get GETs url and returns the status code and the decoded Health.
func get(t *testing.T, url string) (int, Health) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var h Health
	if res.StatusCode == http.StatusNotFound {
		return res.StatusCode, h
	}
	if err := json.NewDecoder(res.Body).Decode(&h); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode, h
}

// Probes of a sleeping service are answered by the supervisor: 200 with
// its state, and the service stays asleep (no restore, however many
// probes). A connection on its --listen address, which is what a TCP
// probe of the service's port would be, wakes it: that is what the
// probes' own address avoids.
func TestProbesDoNotWake(t *testing.T) {
	f := newFake()
	pc := &probeCounter{}
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.Listen = "127.0.0.1:0"
		o.Observer = pc
	})
	srv := httptest.NewServer(r.s.HealthHandler())
	defer srv.Close()
	r.waitState(StateStandby)
	for range 20 {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, h := get(t, srv.URL+path); code != http.StatusOK || h.State != StateStandby {
				t.Fatalf("GET %s while asleep: %d %+v, want 200 in state standby", path, code, h)
			}
		}
	}
	time.Sleep(3 * r.s.o.Idle) // a wake would have restored it by now
	if st := r.s.State(); st != StateStandby {
		t.Fatalf("after 40 probes the state is %s, want standby", st)
	}
	if _, restores, _ := f.snapshot(); len(restores) != 0 {
		t.Fatalf("the probes woke the service: restores %v", restores)
	}
	pc.mu.Lock()
	if pc.probes["healthz ok"] != 20 || pc.probes["readyz ok"] != 20 {
		t.Errorf("probes observed %v, want 20 of each, ok", pc.probes)
	}
	pc.mu.Unlock()
	if code, _ := get(t, srv.URL+"/nothing"); code != http.StatusNotFound {
		t.Errorf("GET /nothing: %d, want 404", code)
	}

	c, err := net.Dial("tcp", r.s.listen.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r.waitState(StateRunning)
	if _, restores, _ := f.snapshot(); len(restores) != 1 {
		t.Fatalf("a connection on --listen: restores %v, want one", restores)
	}
}

// A service that keeps crashing is not ready (no service takes work)
// but kcr standby is live: it restarts the service itself. Once kcr
// standby stops, neither.
func TestProbesBackoffAndStopped(t *testing.T) {
	f := newFake()
	r := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.BackoffMin, o.BackoffMax = time.Minute, time.Minute
	})
	srv := httptest.NewServer(r.s.HealthHandler())
	defer srv.Close()
	r.waitState(StateRunning)
	f.kill(r.s.Status().PID)
	r.waitState(StateBackoff)
	if code, h := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || h.State != StateBackoff {
		t.Errorf("readyz in backoff: %d %+v, want 503", code, h)
	}
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("healthz in backoff: %d, want 200", code)
	}
	r.end()
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, h := get(t, srv.URL+path); code != http.StatusServiceUnavailable || h.State != StateStopped {
			t.Errorf("GET %s once stopped: %d %+v, want 503", path, code, h)
		}
	}
}

// Metrics count the probes by result.
func TestMetricsProbes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Probe("healthz", true)
	m.Probe("readyz", true)
	m.Probe("readyz", false)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`kcr_standby_probes_total{probe="healthz",result="ok"} 1`,
		`kcr_standby_probes_total{probe="readyz",result="ok"} 1`,
		`kcr_standby_probes_total{probe="readyz",result="failed"} 1`,
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, b)
		}
	}
}

// A checkpoint or a restore that lasts longer than the bound fails both
// probes, with the reason; any other state, however long, answers as
// HealthOf does.
func TestHealthAtStuck(t *testing.T) {
	for _, st := range allStates {
		h := HealthAt(st, time.Hour, time.Minute)
		stuck := st == StateCheckpointing || st == StateRestoring
		if stuck && (h.Live || h.Ready || !strings.Contains(h.Why, "stuck")) {
			t.Errorf("%s for an hour: %+v, want neither live nor ready, and why", st, h)
		}
		if !stuck && h != HealthOf(st) {
			t.Errorf("%s for an hour: %+v, want %+v", st, h, HealthOf(st))
		}
		if h := HealthAt(st, 30*time.Second, time.Minute); h != HealthOf(st) {
			t.Errorf("%s for 30 s: %+v, want %+v", st, h, HealthOf(st))
		}
	}
}
