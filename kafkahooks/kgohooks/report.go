package kgohooks

// Report is what a Client or GroupTransactSession reports about its last
// hook run (Report); CheckpointReport gives the same keys as a map, which
// lands in the image manifest. Exactly one of Checkpoint (phase
// "before-checkpoint") and Restore (phase "after-restore") is set.
type Report struct {
	Phase           string `json:"phase"`                      // "before-checkpoint" or "after-restore"
	ClientID        string `json:"client_id"`                  // the client id sent to brokers then
	TransactionalID string `json:"transactional_id,omitempty"` // the transactional id then, "" if not transactional
	InstanceID      string `json:"instance_id,omitempty"`      // the group instance id (kgo.InstanceID) then; a restore suffixes it
	CallersBlocked  int64  `json:"callers_blocked"`            // calls waiting at the gate
	DurationMS      int64  `json:"duration_ms"`                // the hook's run time
	*Checkpoint
	*Restore
}

// Checkpoint holds the before-checkpoint part of a Report. A refused
// checkpoint (Error set) stops at the step that failed; the fields of later
// steps stay zero.
type Checkpoint struct {
	Error string `json:"error,omitempty"` // why the checkpoint was refused
	// Transaction is what happened to the application's transaction:
	// "none" (none was open), "open" (FailOnOpenTxn refused), "committed",
	// "aborted" or "abort failed (<error>)" (the checkpoint is refused
	// unless KeepTxnID); "" if the client is not
	// transactional.
	Transaction    string `json:"transaction,omitempty"`
	RecordsFlushed int64  `json:"records_flushed"` // buffered records acknowledged by the flush
	// RecordsUnflushed counts the records still buffered when the flush
	// ended unfinished (the checkpoint is refused, ErrRecordsNotFlushed).
	RecordsUnflushed int64 `json:"records_unflushed,omitempty"`
	// NextOffsets maps "topic/partition" of each direct partition to the
	// offset the next kgo client starts from.
	NextOffsets map[string]int64 `json:"next_offsets,omitempty"`
	Closed      bool             `json:"closed"` // the hook closed the kgo client (it is replaced at the restore)
	*GroupCheckpoint
	*KeptClient
}

// GroupCheckpoint holds the consumer-group part of a Checkpoint.
type GroupCheckpoint struct {
	Group     string `json:"group"`      // the consumer group
	LeftGroup bool   `json:"left_group"` // the client left the group before the dump
	// PartitionsCommitted counts the partitions whose handed-out offsets
	// the hook committed (Client only), in CommitAttempts attempts.
	PartitionsCommitted int `json:"partitions_committed,omitempty"`
	CommitAttempts      int `json:"commit_attempts,omitempty"`
	// PartitionsPinned counts the partitions the group had no commit for
	// whose start offset (where this member started consuming them) the
	// hook committed, so that the next member does not resolve
	// ConsumeResetOffset again (AtEnd would skip the records produced
	// meanwhile).
	PartitionsPinned int `json:"partitions_pinned,omitempty"`
	// OffsetsRecorded counts the group's committed offsets the hook read
	// after its commits: a restored member continues from them where the
	// group has lost its commit by then (offsets.retention.minutes).
	OffsetsRecorded int `json:"offsets_recorded,omitempty"`
	// StaleCommits is a running total of dropped commits of records
	// handed out before a checkpoint (Client only).
	StaleCommits int64 `json:"stale_commits,omitempty"`
	// InitialDelay is set when the member left its classic group empty: a
	// copy restored from the image waits the broker's
	// group.initial.rebalance.delay.ms (3 s by default) before its first
	// record. A KIP-848 group (kgo.ServerSideBalancer) has no such delay.
	InitialDelay bool `json:"initial_rebalance_delay,omitempty"`
}

// KeptClient holds the part of a Checkpoint that kept the kgo client for a
// resume (no group, or --leave-running) instead of closing it.
type KeptClient struct {
	KeptForResume     bool `json:"kept_for_resume"`    // always true
	ConnectionsClosed int  `json:"connections_closed"` // broker connections the hook closed
	ConnectionsOpen   int  `json:"connections_open"`   // connections open when the hook returned (new dials wait: 0)
}

// Restore holds the after-restore part of a Report.
type Restore struct {
	Event     string `json:"event"`      // "restore" or "resume"
	NewClient bool   `json:"new_client"` // the hook built a new kgo client
	// RecordedOffsetsRestored counts the partitions the restored group
	// member found without a committed offset in the group (expired by
	// offsets.retention.minutes, or deleted) and continued from the offset
	// the image recorded. It is updated when the member joins, after the
	// hook returned.
	RecordedOffsetsRestored int `json:"recorded_offsets_restored,omitempty"`
	// RemovesMember is the member id the checkpoint could not remove from
	// its group (the broker was unreachable); the new client removes it
	// in the background once the broker answers, so that its session
	// does not hold up the group.
	RemovesMember string `json:"removes_member,omitempty"`
}
