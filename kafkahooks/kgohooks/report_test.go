package kgohooks

import (
	"testing"

	"github.com/kcr-dev/kcr/internal/hookreport"
)

// The manifest's map of a Report has the keys kcr's e2e tests and users
// read (internal/hookreport's test checks that they are encoding/json's).
func TestReportKeys(t *testing.T) {
	cases := []struct {
		rep  Report
		keys []string
	}{
		{Report{Phase: "before-checkpoint", ClientID: "c", Checkpoint: &Checkpoint{
			KeptClient: &KeptClient{KeptForResume: true, ConnectionsClosed: 2}}},
			[]string{"phase", "client_id", "callers_blocked", "duration_ms", "records_flushed", "closed",
				"kept_for_resume", "connections_closed", "connections_open"}},
		{Report{Phase: "before-checkpoint", ClientID: "c", TransactionalID: "t", Checkpoint: &Checkpoint{
			Error: "e", Transaction: "aborted", RecordsUnflushed: 1, NextOffsets: map[string]int64{"t/0": 4},
			GroupCheckpoint: &GroupCheckpoint{Group: "g", PartitionsCommitted: 1, CommitAttempts: 2, StaleCommits: 3}}},
			[]string{"phase", "client_id", "transactional_id", "callers_blocked", "duration_ms", "error", "transaction",
				"records_flushed", "records_unflushed", "next_offsets", "closed", "group", "left_group",
				"partitions_committed", "commit_attempts", "stale_commits"}},
		{Report{Phase: "after-restore", ClientID: "c-1", Restore: &Restore{Event: "restore", NewClient: true}},
			[]string{"phase", "client_id", "callers_blocked", "duration_ms", "event", "new_client"}},
	}
	for _, c := range cases {
		var keys []string
		for k := range hookreport.Map(c.rep) {
			keys = append(keys, k)
		}
		if !equalSets(keys, c.keys) {
			t.Errorf("keys of %s report = %v, want %v", c.rep.Phase, keys, c.keys)
		}
	}
}

func equalSets(a, b []string) bool {
	m := map[string]bool{}
	for _, k := range a {
		m[k] = true
	}
	for _, k := range b {
		if !m[k] {
			return false
		}
	}
	return len(m) == len(b)
}
