// Package order is the demo's order record, the value of a record in the
// orders topic: examples/loadgen produces it, examples/pipeline consumes it,
// and the standby benchmarks' probes (test/apps/wakeprobe,
// test/apps/replicabench) produce single orders of their own.
package order

// Order n is the record with key "order-<n>" (loadgen's) or any unique id.
type Order struct {
	ID string `json:"id"`
	N  int64  `json:"n"`
	// TS is when the order was produced, in Unix nanoseconds.
	TS int64 `json:"ts"`
}
