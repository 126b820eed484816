package engine

import (
	"debug/buildinfo"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
)

// DefaultKafkaPorts are the broker ports kcr recognises, unless
// CheckpointOptions.KafkaPorts says otherwise: Kafka's default listener
// (9092) and the ports commonly given to its TLS and SASL listeners.
var DefaultKafkaPorts = []int{9092, 9093, 9094}

// kafkaClientModules are the Go modules of Kafka clients. A binary that
// links one may hold Kafka connections to any port.
var kafkaClientModules = []string{
	"github.com/segmentio/kafka-go",
	"github.com/twmb/franz-go",
	"github.com/IBM/sarama",
	"github.com/Shopify/sarama",
	"github.com/confluentinc/confluent-kafka-go",
}

// ErrKafkaTCPClose refuses a restore that would run more than one copy of
// Kafka connections that CRIU closed (--tcp-close) instead of a hook;
// RestoreOptions.AllowDuplicates allows it.
var ErrKafkaTCPClose = errors.New("restore would give more than one copy the Kafka client state that --tcp-close kept")

// kafkaTCPHint is the advice for a Kafka connection left open: never
// --tcp-close, which keeps the client's identity in the image.
const kafkaTCPHint = "a Kafka client's connection is still open: wrap the client with kafkahooks (kafka-go) or kgohooks (franz-go) so that a hook closes it; " +
	"do not use --tcp-close for it: the image would keep the client's producer id, sequence numbers and group membership, and copies lose records or share a group member"

// kafkaJudge tells which TCP connections left open after the hooks are a
// Kafka client's.
type kafkaJudge struct {
	ports map[uint16]bool
	// clients are the Kafka client modules the target's binary links
	// ("path version").
	clients []string
}

func newKafkaJudge(ports []int, clients []string) kafkaJudge {
	if ports == nil {
		ports = DefaultKafkaPorts
	}
	k := kafkaJudge{ports: map[uint16]bool{}, clients: clients}
	for _, p := range ports {
		if p > 0 && p < 1<<16 {
			k.ports[uint16(p)] = true
		}
	}
	return k
}

// kafka says whether p is a TCP connection to a Kafka broker port.
func (k kafkaJudge) kafka(p criu.Problem) bool {
	return p.Cause == criu.CauseTCPEstablished && p.Peer.IsValid() && k.ports[p.Peer.Port()]
}

// describe returns p's description with what makes it a Kafka connection.
func (k kafkaJudge) describe(p criu.Problem) string {
	if k.kafka(p) {
		return p.String() + " (Kafka broker port " + strconv.Itoa(int(p.Peer.Port())) + ")"
	}
	return p.String()
}

// tcpHint is the advice for TCP connections left open when none is to a
// Kafka port.
func (k kafkaJudge) tcpHint() string {
	if len(k.clients) > 0 {
		return "no hook closed it: close it in a BeforeCheckpoint hook; the binary links " + strings.Join(k.clients, ", ") +
			": if this is a Kafka connection, wrap that client with kafkahooks or kgohooks and do not use --tcp-close for it (copies would share its producer id and group membership); --tcp-close is safe only for connections that are not Kafka clients'"
	}
	return "no hook closed it: close it in a BeforeCheckpoint hook, or pass --tcp-close to let CRIU drop it"
}

// closedByCRIU returns the connections that --tcp-close makes CRIU drop and
// that are, or may be, a Kafka client's: those to a Kafka port, and every
// TCP connection of a binary that links a Kafka client.
func (k kafkaJudge) closedByCRIU(probs []criu.Problem) []string {
	var out []string
	for _, p := range probs {
		switch {
		case k.kafka(p):
			out = append(out, k.describe(p))
		case p.Cause == criu.CauseTCPEstablished && len(k.clients) > 0:
			out = append(out, p.String()+" (the binary links "+strings.Join(k.clients, ", ")+")")
		}
	}
	return out
}

// linkedKafkaClients returns the Kafka client modules that the executable
// of pid links, from its Go build information; nil for a binary that is not
// Go, links none, or cannot be read.
func linkedKafkaClients(pid int) []string {
	return kafkaClientsOf("/proc/" + strconv.Itoa(pid) + "/exe")
}

// kafkaClientsOf is linkedKafkaClients for the executable at path.
func kafkaClientsOf(path string) []string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, d := range bi.Deps {
		for _, m := range kafkaClientModules {
			if d.Path == m || strings.HasPrefix(d.Path, m+"/v") {
				out = append(out, d.Path+" "+d.Version)
			}
		}
	}
	slices.Sort(out)
	return out
}

// checkKafkaTCPClose refuses a restore of count copies of m when m was
// dumped with --tcp-close while Kafka connections were open and more than
// one copy would run (count > 1, or the --leave-running original), unless
// allowed.
func checkKafkaTCPClose(image string, m *images.Manifest, count int, allow bool) error {
	conns := m.Options.TCPClosedKafka
	if allow || !m.Options.TCPClose || len(conns) == 0 || (count <= 1 && !m.Options.LeaveRunning) {
		return nil
	}
	copies := count
	why := fmt.Sprintf("--count %d", count)
	if m.Options.LeaveRunning {
		copies++
		why = "the --leave-running original"
		if count > 1 {
			why += fmt.Sprintf(" and --count %d", count)
		}
	}
	return fmt.Errorf("%w: %s was dumped with --tcp-close while Kafka connections were open (%s); with %s, %d copies would reuse the client's producer id, sequence numbers and group membership (records lost as duplicates, a member shared); restore one copy, wrap the client with kafkahooks or kgohooks, or pass --allow-duplicates to restore anyway",
		ErrKafkaTCPClose, image, strings.Join(conns, "; "), why, copies)
}
