package standby

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kcr-dev/kcr/standby/kafkastandby"
)

// The metrics follow what the supervisor reports, in the text format.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.State(StateRunning)
	m.State(StateStandby)
	m.Wake("kafka", 250*time.Millisecond)
	m.Wake("kafka", 150*time.Millisecond)
	m.Wake("connection", 50*time.Millisecond)
	m.Checkpoint(400*time.Millisecond, 20<<20, nil)
	m.Checkpoint(time.Second, 0, errors.New("refused"))
	m.Restore(120*time.Millisecond, nil)
	m.ColdStart("first start")
	m.BrokerRequests(7)
	m.BrokerRequests(3)
	m.GroupHold(kafkastandby.HoldHeld)
	m.GroupHold(kafkastandby.HoldReleased)
	m.GroupHold(kafkastandby.HoldHeld)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	text := string(b)
	for _, want := range []string{
		`kcr_standby_state{state="standby"} 1`,
		`kcr_standby_state{state="running"} 0`,
		`kcr_standby_wakes_total{source="kafka"} 2`,
		`kcr_standby_wakes_total{source="connection"} 1`,
		`kcr_standby_wake_latency_seconds_count 3`,
		`kcr_standby_wake_latency_seconds_bucket{le="0.2"} 2`,
		`kcr_standby_checkpoint_duration_seconds_count 1`,
		`kcr_standby_failures_total{op="checkpoint"} 1`,
		`kcr_standby_restore_duration_seconds_count 1`,
		`kcr_standby_image_bytes 2.097152e+07`,
		`kcr_standby_cold_starts_total{reason="first start"} 1`,
		`kcr_standby_broker_requests_total 10`,
		`kcr_standby_group_holds_total{result="held"} 2`,
		`kcr_standby_group_holds_total{result="released"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}
