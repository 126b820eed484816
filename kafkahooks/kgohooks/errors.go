package kgohooks

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

var (
	// ErrOpenTxn is the error of a checkpoint refused by FailOnOpenTxn.
	ErrOpenTxn = errors.New("kgohooks: a transaction is open")
	// ErrTxnAbortedByCheckpoint is returned for calls that belong to a
	// transaction the before-checkpoint hook aborted (AbortOpenTxn).
	ErrTxnAbortedByCheckpoint = errors.New("kgohooks: the transaction was aborted by a checkpoint; begin a new one")
	// ErrRecordsNotFlushed is the error of a checkpoint refused because buffered
	// records were not all acknowledged within the hook's budget.
	ErrRecordsNotFlushed = errors.New("kgohooks: records not acknowledged within the checkpoint budget")
	// ErrRebalanceBlocked is the error of a checkpoint refused because the
	// application, with kgo.BlockRebalanceOnPoll, kept records it polled
	// without calling AllowRebalance for half the hook's budget: kgo cannot
	// leave the group before it does. Nothing was torn down; the client
	// goes on as the same group member.
	ErrRebalanceBlocked = errors.New("kgohooks: the application holds polled records and has not called AllowRebalance (kgo.BlockRebalanceOnPoll)")
	// ErrAuthAfterRestore is the error of an after-restore hook whose new
	// client's credentials the brokers refused (a password changed or a user
	// removed while the image waited): one error that kcr restore and kcr
	// standby report, instead of requests failing in the background.
	ErrAuthAfterRestore = errors.New("kgohooks: SASL authentication failed after the restore")
)

// IsFenced reports whether err is one the broker gives a transactional
// producer after another one took its transactional id: after a restore
// with KeepTxnID, the instance that initialized the id last fences the
// other. Kafka 4.1 (transactions v2) answers the fenced one with
// kerr.InvalidProducerEpoch on a produce, kerr.ProducerFenced, or
// kerr.InvalidTxnState when it ends a transaction the new holder aborted;
// kgo then refuses to begin another. A fenced client cannot commit again;
// kgohooks does not replace it, because the id now belongs to the other
// instance: stop producing and Close it.
func IsFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidTxnState)
}
