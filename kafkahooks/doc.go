// Package kafkahooks makes segmentio/kafka-go clients take part in kcr
// checkpoints. A service changes one constructor call per client:
//
//	w := kafkahooks.NewWriter(&kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "events"})
//	r := kafkahooks.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "billing", Topic: "events"})
//
// and keeps calling WriteMessages, FetchMessage, CommitMessages, Stats,
// Close, … as before. Each Writer and Reader registers itself with a
// notify.Registry (notify.Default unless WithRegistry says otherwise) and
// owns the kafka-go values, transports and dialers behind it:
//
//   - before a checkpoint it closes a gate (calls that start then wait, they
//     never fail because of the checkpoint), drains what is in flight within
//     the hook's budget and closes every TCP connection;
//   - after a restore it reconnects with a fresh client id (base id + "-" +
//     short instance id), after a resume with the same one, and opens the
//     gate.
//
// Delivery is at-least-once across a checkpoint: records a Writer could not
// get acknowledged within the budget are carried in the image and sent after
// the restore, before new ones; a group Reader may deliver again records that
// were handed out but not committed, and never moves a committed offset back.
// See Writer and Reader for the details, and CheckpointReport for what lands
// in the image manifest.
//
// Other clients (HTTP, databases, a schema registry) take part through
// package github.com/kcr-dev/kcr/hooks.
//
// Outside checkpoints the wrappers cost a few atomic operations per call; see
// BenchmarkHotPath and BenchmarkProduceWrapper in this directory, and
// scripts/bench-kafkahooks.sh.
//
// Tests can run whole cycles in-process with (*notify.Registry).Simulate on a
// registry of their own:
//
//	reg := notify.NewRegistry()
//	w := kafkahooks.NewWriter(tmpl, kafkahooks.WithRegistry(reg))
//	res, err := reg.Simulate(ctx, notify.SimRestore, 5*time.Second)
package kafkahooks
