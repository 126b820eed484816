package kafkahooks

// WriterReport is what a Writer reports about its last hook run
// (Writer.Report); CheckpointReport gives the same keys as a map, which
// lands in the image manifest. Exactly one of WriterCheckpoint (phase
// "before-checkpoint") and WriterRestore (phase "after-restore") is set.
type WriterReport struct {
	Phase    string `json:"phase"`     // "before-checkpoint" or "after-restore"
	ClientID string `json:"client_id"` // the client id sent to brokers then
	// RecordsCarried counts the records not acknowledged when the
	// checkpoint was taken (before) or still carried when the
	// after-restore hook began (after).
	RecordsCarried int64 `json:"records_carried"`
	CallersBlocked int64 `json:"callers_blocked"` // calls waiting at the gate
	DurationMS     int64 `json:"duration_ms"`     // the hook's run time
	*WriterCheckpoint
	*WriterRestore
}

// WriterCheckpoint holds the before-checkpoint part of a WriterReport.
type WriterCheckpoint struct {
	Async              bool  `json:"async"`               // the kafka.Writer is Async
	Drained            bool  `json:"drained"`             // every record was acknowledged within the budget
	RecordsPending     int64 `json:"records_pending"`     // held by kafka-go when the hook began
	RecordsDrained     int64 `json:"records_drained"`     // of them, acknowledged before the dump
	CompletionsPending int   `json:"completions_pending"` // Completion calls not returned yet
	ConnectionsClosed  int   `json:"connections_closed"`  // broker connections the hook closed
}

// WriterRestore holds the after-restore part of a WriterReport. The
// interruption and failure counts are running totals.
type WriterRestore struct {
	Event            string `json:"event"`             // "restore" or "resume"
	RecordsDelivered int64  `json:"records_delivered"` // carried records acknowledged within the hook
	GateOpen         bool   `json:"gate_open"`         // writes resumed; false while carried records are still resent
	// RequestsInterrupted counts produce requests cut off on the wire by
	// a checkpoint (each cost its batch one of MaxAttempts).
	RequestsInterrupted int64 `json:"requests_interrupted"`
	// RecordsInterrupted counts records whose caller or Completion got
	// that interruption as their error (no attempt left; each may be on
	// the topic).
	RecordsInterrupted int64 `json:"records_interrupted"`
	// RecordsFailed counts carried records failed with a fatal error.
	RecordsFailed int64 `json:"records_failed"`
}

// ReaderReport is what a Reader reports about its last hook run
// (Reader.Report); CheckpointReport gives the same keys as a map.
// ReaderCheckpoint is set in the "before-checkpoint" phase, Event in the
// "after-restore" one.
type ReaderReport struct {
	Phase          string `json:"phase"`           // "before-checkpoint" or "after-restore"
	Event          string `json:"event,omitempty"` // after-restore: "restore" or "resume"
	ClientID       string `json:"client_id"`       // the client id sent to brokers then
	CallersBlocked int64  `json:"callers_blocked"` // calls waiting at the gate
	// NextOffset is, for a partition reader (no group), the offset the
	// next kafka.Reader starts from; nil for a group reader.
	NextOffset *int64 `json:"next_offset,omitempty"`
	DurationMS int64  `json:"duration_ms"` // the hook's run time
	*ReaderCheckpoint
	*GroupRestore
}

// ReaderCheckpoint holds the before-checkpoint part of a ReaderReport.
type ReaderCheckpoint struct {
	Group             string `json:"group"`              // the consumer group, "" for a partition reader
	ClosedCleanly     bool   `json:"closed_cleanly"`     // the kafka.Reader closed within the budget
	PrefetchedDropped int64  `json:"prefetched_dropped"` // fetched again after the checkpoint
	ConnectionsClosed int    `json:"connections_closed"` // broker connections the hook closed
	*GroupCheckpoint
}

// GroupCheckpoint holds the consumer-group part of a ReaderCheckpoint.
type GroupCheckpoint struct {
	LeftGroup bool `json:"left_group"` // the reader closed, leaving the group
	// StaleCommits is a running total of dropped commits of records
	// fetched before a checkpoint.
	StaleCommits          int64  `json:"stale_commits"`
	StartOffsetsCommitted int    `json:"start_offsets_committed"` // partitions whose resolved start offset was committed
	CommitError           string `json:"commit_error,omitempty"`  // why commits were left unflushed
	// OffsetsRecorded counts the group's committed offsets (of the
	// Reader's topics) recorded in the image, to be restored if the broker
	// has lost them by the restore (offsets.retention.minutes).
	OffsetsRecorded int `json:"offsets_recorded"`
	// RecordsInApp counts, at most, the records handed to the application
	// and not committed, nor waiting to be committed at the gate: the
	// application may be processing them when the process is dumped, and
	// every restored copy finishes them. kcr restore counts them like
	// carried records (--count > 1 or a --leave-running image needs
	// --allow-duplicates).
	RecordsInApp int64 `json:"records_in_app"`
	// CommitWaitMS is how long the hook waited for the application to
	// commit records it held (WithCommitWait).
	CommitWaitMS       int64  `json:"commit_wait_ms,omitempty"`
	OffsetsRecordError string `json:"offsets_record_error,omitempty"` // why none were recorded
	// MemberKept is, with WithGroupHandover, the member id left in the
	// group across the checkpoint; a restore or resume within
	// SessionTimeoutMS removes it once its new member has joined.
	MemberKept       string `json:"member_kept,omitempty"`
	SessionTimeoutMS int64  `json:"session_timeout_ms,omitempty"` // with MemberKept: how long it stays
	// GroupEmpty: the checkpoint left the group without members on a
	// broker whose group.initial.rebalance.delay.ms
	// (InitialRebalanceDelayMS) holds the first join of a restored member;
	// Warning says so in words.
	GroupEmpty              bool   `json:"group_empty,omitempty"`
	InitialRebalanceDelayMS int64  `json:"initial_rebalance_delay_ms,omitempty"`
	Warning                 string `json:"warning,omitempty"`
	DiagnoseError           string `json:"diagnose_error,omitempty"` // why the group or the broker could not be asked
}

// GroupRestore holds the consumer-group part of an after-restore
// ReaderReport: the committed offsets recorded in the image, checked
// against the broker's before the Reader rejoined.
type GroupRestore struct {
	OffsetsChecked int `json:"offsets_checked"` // recorded offsets compared with the broker's
	// OffsetsRestored lists the offsets the broker no longer had (expired
	// or deleted while the service was checkpointed), committed again
	// from the image.
	OffsetsRestored   []PartitionOffset `json:"offsets_restored,omitempty"`
	OffsetsCheckError string            `json:"offsets_check_error,omitempty"` // why the check or the commit failed
}

// PartitionOffset is a committed offset: the next record to consume.
type PartitionOffset struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
}
