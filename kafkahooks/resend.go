package kafkahooks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// errTransportClosed fails requests held across a checkpoint when the Writer
// is closed before they could be delivered.
var errTransportClosed = errors.New("kafkahooks: writer closed before records held across a checkpoint could be delivered")

// interruptedError is returned to kafka-go for a produce request that was on
// the wire when the checkpoint budget ran out and its connection was closed.
// Its outcome is unknown (the broker may have appended it), so it is reported
// as a temporary error: the kafka.Writer retries the batch with a fresh
// request, which waits at the transport's gate and is sent after the restore.
// This costs the batch one of its MaxAttempts.
type interruptedError struct{ err error }

func (e *interruptedError) Error() string {
	return "kafkahooks: produce request interrupted by a checkpoint (retried after restore if the batch has attempts left; the broker may have stored it): " + e.err.Error()
}
func (e *interruptedError) Unwrap() error   { return e.err }
func (e *interruptedError) Temporary() bool { return true }

// CarriedFailedError fails records carried across a checkpoint when resending
// them meets an error that waiting will not cure: authentication, an ACL, a
// deleted topic, or a partition that no longer exists (the topic was
// recreated with fewer partitions: the records are not moved to another
// partition, which would break the order per key). A topic is taken as gone
// once three resends in a row fail and the broker's metadata confirms it;
// with the Writer's AllowAutoTopicCreation the metadata request asks the
// broker to create it, as kafka-go does for new records, and the records go
// to the new topic if their partition exists there. Their callers and Completions get it (wrapped in
// kafka.WriteErrors for sync callers), as for any batch kafka-go gives up.
type CarriedFailedError struct {
	Err error // what the resend met
}

// Error says the carried records failed, and why.
func (e *CarriedFailedError) Error() string {
	return "kafkahooks: records carried across a checkpoint failed: " + e.Err.Error()
}

// Unwrap returns Err.
func (e *CarriedFailedError) Unwrap() error { return e.Err }

// Temporary is false: kafka-go must not retry the batch.
func (e *CarriedFailedError) Temporary() bool { return false }

// missingTopicAttempts is how many resends in a row must find the topic
// missing from metadata that the broker did answer before the records fail.
const missingTopicAttempts = 3

// fatalResend says whether err, met resending held records, is fatal:
// retrying with backoff will not cure it.
func fatalResend(err error) bool {
	var ke kafka.Error
	if errors.As(err, &ke) {
		return !ke.Temporary()
	}
	var (
		ua x509.UnknownAuthorityError
		ci x509.CertificateInvalidError
		he x509.HostnameError
		ae tls.AlertError
	)
	return errors.As(err, &ua) || errors.As(err, &ci) || errors.As(err, &he) || errors.As(err, &ae)
}

// missingTopic says whether err means the topic was not found.
func missingTopic(err error) bool {
	return errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition) || errors.Is(err, kafka.UnknownTopicOrPartition)
}

// topicsGone asks the broker, through t, whether a topic or partition of h
// is gone: the broker answers and lists the topic as unknown or not at all,
// or lists it without the partition (the topic was recreated with fewer
// partitions). With autoCreate (the Writer's AllowAutoTopicCreation) the
// request asks the broker to create missing topics, as kafka-go's Writer
// does for new records, so a topic that the broker creates is not gone.
func topicsGone(ctx context.Context, t *kafka.Transport, addr net.Addr, h *heldProduce, autoCreate bool) bool {
	names := make([]string, len(h.topics))
	for i, tp := range h.topics {
		names[i] = tp.topic
	}
	// Without autoCreate kafka-go answers from its metadata cache, which
	// the resend loop drops after each failed attempt; with it, kafka-go
	// asks the broker for topics missing from the cache and waits for them.
	res, err := t.RoundTrip(ctx, addr, &metadataAPI.Request{TopicNames: names, AllowAutoTopicCreation: autoCreate})
	if err != nil {
		return false // not answered: the broker may just be unreachable
	}
	known := map[string]map[int32]bool{}
	for _, tp := range res.(*metadataAPI.Response).Topics {
		switch kafka.Error(tp.ErrorCode) {
		case 0:
			parts := map[int32]bool{}
			for _, p := range tp.Partitions {
				parts[p.PartitionIndex] = true
			}
			known[tp.Name] = parts
		case kafka.UnknownTopicOrPartition:
		default:
			// The topic exists but is not usable yet (a leader being
			// elected, a topic just created): not gone.
			known[tp.Name] = nil
		}
	}
	for _, tp := range h.topics {
		parts, ok := known[tp.topic]
		if !ok {
			return true
		}
		if parts == nil {
			continue
		}
		for _, p := range tp.parts {
			if !parts[p.partition] {
				return true
			}
		}
	}
	return false
}

// isInterrupted says whether err is a produce request cut off by a
// checkpoint.
func isInterrupted(err error) bool {
	var ie *interruptedError
	return errors.As(err, &ie)
}
