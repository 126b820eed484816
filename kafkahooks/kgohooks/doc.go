// Package kgohooks makes franz-go (kgo) clients take part in kcr
// checkpoints. A service changes one constructor per client:
//
//	cl, err := kgohooks.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("events"))
//	s, err := kgohooks.NewGroupTransactSession(kgo.ConsumerGroup("etl"), kgo.TransactionalID("etl"), ...)
//
// and keeps calling Produce, ProduceSync, PollFetches, CommitRecords,
// Flush, Begin, End, … as before. Each value registers with a
// notify.Registry (notify.Default unless WithRegistry) and owns one
// kgo.Client per checkpoint cycle.
//
// kgo producers are idempotent by default, which makes an image dangerous:
// it would carry the producer id, epoch and sequence numbers, and two copies
// of it (clones, or an original that went on after --leave-running) would
// write with the same ones. The broker answers the second copy with
// DUPLICATE_SEQUENCE_NUMBER, which kgo takes as success: records are
// silently lost. So no record is ever carried in an image, and every
// restore ends with a new kgo.Client, which gets a new producer id from the
// broker.
//
// The Client dials through its own kgo.Dialer (wrapping the user's, or kgo's
// default built from DialTimeout and DialTLSConfig), the connection tracker
// kafkahooks uses for kafka-go, so that a checkpoint can close every
// connection without closing the client; kgo has no other way.
//
// # Before a checkpoint
//
//   - The gate closes: Produce, ProduceSync, TryProduce, PollFetches and
//     Begin/BeginTransaction calls wait until the process is resumed or
//     restored, or until their own ctx ends. They never fail because of the
//     checkpoint. A poll waiting for records ends without any and waits too.
//   - A transaction the application has begun gets half the budget to be
//     ended by the application: its Produce, Flush and End calls pass the
//     gate.
//     Then OpenTxnPolicy applies: abort it (the default), commit it, or fail
//     the checkpoint.
//   - Flush, within the budget. If records remain unacknowledged, the hook
//     fails with ErrRecordsNotFlushed inside a notify.CarryError: the checkpoint
//     is refused as a carry veto (kcr exits 10, nothing is dumped) and the
//     client goes on unchanged.
//   - A group consumer commits, with kgo's own calls and retries, what kgo
//     would autocommit: every polled record (CommitUncommittedOffsets), or
//     the marked ones with kgo.AutoCommitMarks. With kgo.DisableAutoCommit
//     the application's commits in progress finish first (commits pass the
//     gate until then). A commit that keeps failing fails the checkpoint.
//     Then it leaves the group (LeaveGroupContext), so the other members
//     take its partitions at once, unless the checkpoint is a
//     --leave-running one (notify.LeaveRunning): the process goes on, so
//     it stays in the group. A leave that cannot reach the broker (it went
//     away during the hook) leaves the member in the group: the next
//     client, restored or resumed, removes it as soon as the broker
//     answers (Restore.RemovesMember), so that its session does not hold
//     up the group. On a refused checkpoint, the client that began leaving
//     has its connections cut and its Close is waited for one second at
//     most, not for as long as the broker is gone.
//   - Without a consumer group (producers, transactional or not, and direct
//     partitions), or with one that stays in its group, the kgo client is
//     kept: its connections are closed and new dials wait, so no
//     connection is open at the dump. A group member that left is closed,
//     with all its connections.
//   - With kgo.BlockRebalanceOnPoll, kgo cannot leave the group while the
//     application holds a poll it has not released with AllowRebalance
//     (call the wrapper's). A poll the checkpoint ends is released by the
//     wrapper (the application never sees it); for records the
//     application holds, the hook waits up to half its budget for its
//     AllowRebalance, letting its other calls (Produce, …) through, and
//     then refuses the checkpoint with ErrRebalanceBlocked before anything
//     is torn down: the member goes on unchanged.
//   - A group member commits (pins) the start offset of every partition it
//     was assigned without a commit and that still has none (nothing
//     polled, or polled and not committed): kgohooks resolves those start
//     offsets itself in kgo's AdjustFetchOffsetsFn (the user's runs first),
//     so the next member does not resolve AtEnd again past the records
//     produced meanwhile. A pin carries the leader's current epoch, as a
//     commit of polled records does: kgo validates committed epochs before
//     it fetches and sends one fetch per broker at a time, so a pin without
//     one would be long-polled alone (FetchMaxWait) while the records of the
//     other partitions wait. It then records the group's committed offsets:
//     a restored member that finds a partition without a commit (expired by
//     offsets.retention.minutes while the group was empty, or deleted)
//     continues from the recorded offset, logs it, and counts it in its
//     after-restore report.
//   - A direct consumer of whole topics (kgo.ConsumeTopics or ConsumeRegex
//     without a group) drains what kgo buffered and records its positions;
//     the next client (or the same one, resumed) is moved to them with
//     SetOffsets, and no record is handed out twice.
//   - A transaction whose abort fails (the coordinator does not answer
//     within the budget) refuses the checkpoint, unless KeepTxnID.
//
// The Report of the hook run (CheckpointReport gives it as a map, in the
// image manifest) says how many records were flushed, how many partitions
// committed, what happened to an open transaction, and, for direct
// partitions, the exact next offsets.
//
// # After a restore or resume
//
// On a resume (the dump failed, or --leave-running) a client without a
// group goes on with the same kgo.Client, reconnected: the same producer id,
// transactional id and sequence numbers (nothing was in flight at the
// checkpoint), and direct partitions at kgo's own positions. On a restore
// the image's kgo client is closed (its waiting dials fail, so it never
// reaches the broker) and a new one is built with the same options: a new
// producer id.
//
// A group consumer (kgo.ConsumerGroup, and every GroupTransactSession)
// checkpointed with --leave-running is resumed the same way: the same
// member, with no rebalance. A copy restored from that image replaces the
// image's client without its LeaveGroup reaching the broker, so the
// original keeps its membership. A group consumer that left its group (any
// other checkpoint) gets a new kgo.Client if its dump fails and it is
// resumed: kgo cannot rejoin a group it left (LeaveGroupContext ends its
// group consumer for good, and kgo has no call to join again), so it is a
// new member with a new producer id and the same client id.
//
// On Restore its client id is the base id + "-" + the first 8 hex digits of
// notify.Event.InstanceID, and so is its transactional id unless
// WithTxnIDPolicy(KeepTxnID) keeps it (a migration: the restored copy fences
// the original). On Resume the identity stays. A group consumer joins the
// group as a new member and continues from the committed offsets; direct
// partitions (kgo.ConsumePartitions) continue at exactly the offset after
// the last record handed to the application. Then the gate opens.
//
// A checkpoint refused by a hook (this one's or another's) resumes with the
// same kgo client, unless it is a group consumer that had already left its
// group.
//
// # Delivery
//
// Producing is at-least-once: a record is acknowledged before the dump or
// sent after it by each running copy; never both, never lost. A group
// consumer never moves a committed offset back across a checkpoint: a
// commit, after one, of a record handed out before it is left out unless
// the new member delivered that offset again and has not committed beyond
// it (stale_commits counts them). Records handed out and not committed may
// be delivered again (Kafka's at-least-once rule). A GroupTransactSession
// is exactly-once: see its documentation.
//
// # Group protocols and static members
//
// Both group protocols are supported: classic, and KIP-848
// (kgo.ServerSideBalancer, Kafka 4.0+, franz-go recommends 4.3+). Every
// restored copy has a new kgo client, so a KIP-848 member joins under a new
// member id, which kgo draws itself (KIP-1082): clones are distinct members.
// kgohooks does not turn KIP-848 on by itself: it is the recommended option
// for group consumers that are restored (see docs/franz-go-kip848.md), since
// a classic group that the checkpoint emptied holds the restored member's
// join for the broker's group.initial.rebalance.delay.ms (3 s by default).
//
// A static member (kgo.InstanceID) is removed from its group by the
// checkpoint (kgo would leave it there until its session times out), and
// every restored copy joins under instance id base + "-" + the first 8 hex
// digits of notify.Event.InstanceID, like its client id: clones, and a copy
// beside an original that went on after --leave-running, never fence each
// other. A resume keeps the instance id. InstanceID returns the current one.
//
// # Share groups
//
// A member of a share group (kgo.ShareGroup, KIP-932) is a ShareConsumer
// (NewShareConsumer). Before a checkpoint it waits for the application to
// poll again, which hands back the records of its last poll, releases those
// it still holds when the wait ends (WithHeldWait, WithHeldPolicy), flushes
// the acknowledgements and leaves the group: no acquired record is ever in
// an image. After the dump, and after a resume, it joins as a new member
// with a new kgo client. See docs/share-groups.md.
//
// Tests run whole cycles in-process with (*notify.Registry).Simulate:
//
//	reg := notify.NewRegistry()
//	cl, _ := kgohooks.New(kopts, kgohooks.WithRegistry(reg))
//	res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second)
package kgohooks
