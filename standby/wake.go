package standby

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/kcr-dev/kcr/standby/kafkawake"
)

// wakeSource finds the work that wakes the sleeping service (besides a
// manual wake and a connection on --listen).
type wakeSource interface {
	// name is the source's name: the "source" of its wakes, and its key
	// in the state file.
	name() string
	// busy is asked before a checkpoint: why the service must not sleep
	// now ("": it may). An error means unknown, and the checkpoint goes
	// on: the wait wakes the service on any work.
	busy(ctx context.Context) (why string, err error)
	// wait returns nil once work arrived, or ctx.Err() when ctx ended; the
	// source's own errors never end it.
	wait(ctx context.Context) error
	// saveState and loadState carry what the source needs across restarts
	// of kcr standby, in the state file.
	saveState() (json.RawMessage, error)
	loadState(json.RawMessage) error
	close()
}

// kafkaSource is the Kafka wake: records past the commits of the service's
// consumer group.
type kafkaSource struct{ w *kafkawake.Watcher }

func newKafkaSource(ctx context.Context, o *Options) (*kafkaSource, error) {
	w, err := kafkawake.New(ctx, kafkawake.Config{Brokers: o.Brokers, Group: o.Group, Topics: o.Topics, Poll: o.Poll,
		BrokerTimeout: o.BrokerTimeout, Logger: o.Logger, Requests: o.Observer.BrokerRequests, Opts: o.kafkaOpts})
	if errors.Is(err, kafkawake.ErrConfig) {
		return nil, fmt.Errorf("%w: %v", ErrBadOption, err)
	}
	if err != nil {
		return nil, err
	}
	return &kafkaSource{w}, nil
}

func (k *kafkaSource) name() string { return "kafka" }

func (k *kafkaSource) busy(ctx context.Context) (string, error) {
	n, topics, err := k.w.Pending(ctx)
	switch {
	case errors.Is(err, kafkawake.ErrNoTopics):
		return blindWhy + err.Error(), nil
	case err != nil:
		return "", err
	case n > 0:
		return fmt.Sprintf("%d records wait on %v", n, topics), nil
	}
	return "", nil
}

func (k *kafkaSource) wait(ctx context.Context) error { return k.w.Wait(ctx) }

func (k *kafkaSource) saveState() (json.RawMessage, error) { return json.Marshal(k.w.State()) }

func (k *kafkaSource) loadState(b json.RawMessage) error {
	var st kafkawake.State
	if err := json.Unmarshal(b, &st); err != nil {
		return err
	}
	k.w.SetState(st)
	return nil
}

func (k *kafkaSource) close() { k.w.Close() }

// listen opens --listen, which must be free.
func listen(addr string) (*net.TCPListener, error) {
	// Not MPTCP (Go's default for listeners): CRIU cannot dump it.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --listen %s: %v: choose a free address", ErrBadOption, addr, err)
	}
	return ln.(*net.TCPListener), nil
}
