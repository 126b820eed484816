package main

import (
	"testing"
	"time"
)

// A duplicate is explained only by a fault that loses commits and that
// overlaps the order's processings.
func TestExplain(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	at := func(s ...int) []time.Time {
		var ts []time.Time
		for _, x := range s {
			ts = append(ts, t0.Add(time.Duration(x)*time.Second))
		}
		return ts
	}
	sv := &service{faultLog: []faultSpan{
		{"wake-storm", t0.Add(5 * time.Second), t0.Add(6 * time.Second)},
		{"kill-service", t0.Add(100 * time.Second), t0.Add(100 * time.Second)},
		{"broker-restart", t0.Add(200 * time.Second), t0.Add(230 * time.Second)},
	}}
	for _, c := range []struct {
		at   []time.Time
		want string
	}{
		{at(4, 7), ""},                     // only a wake storm between
		{at(99, 103), "kill-service"},      // killed between the two
		{at(95, 96), ""},                   // both before the kill
		{at(231, 240), "broker-restart"},   // processed as the broker came back
		{at(100+5, 100+6), "kill-service"}, // its commit cut short by the kill just before
		{at(100+11, 100+12), ""},           // long after the kill
	} {
		if got := sv.explain(c.at); got != c.want {
			t.Errorf("duplicate at %v: explained by %q, want %q", c.at, got, c.want)
		}
	}
}
