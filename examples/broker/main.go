// Command broker runs an embedded, in-memory Kafka broker (franz-go's kfake)
// for kcr's demo and quick experiments:
//
//	broker -addr 127.0.0.1:19092 -topics orders:3,results:3
//
// It prints one JSON line when it accepts connections and runs until SIGTERM
// or SIGINT. kfake is not Apache Kafka: it keeps everything in memory, has a
// single broker and no replication. It speaks enough of the protocol for
// segmentio/kafka-go's producer and consumer groups and for franz-go.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:19092", "address to listen on (the host must be 127.0.0.1: kfake listens on loopback only)")
	topics := flag.String("topics", "orders:3,results:3", "topics to create, as name:partitions[,name:partitions...]")
	minSession := flag.Duration("min-session-timeout", time.Second, "smallest consumer group session timeout the broker accepts")
	logLevel := flag.String("log-level", "none", "kfake log level: none, error, warn, info, debug (on stderr)")
	flag.Parse()

	opts, err := options(*addr, *topics, *minSession, *logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(2)
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"ev": "ready", "addrs": c.ListenAddrs(), "topics": *topics, "pid": os.Getpid(),
	})
	<-sig
	c.Close()
}

// options turns the flags into kfake options.
func options(addr, topics string, minSession time.Duration, logLevel string) ([]kfake.Opt, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-addr %q: %w", addr, err)
	}
	if host != "127.0.0.1" && host != "localhost" && host != "" {
		return nil, fmt.Errorf("-addr %q: kfake listens on 127.0.0.1 only", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("-addr %q: bad port", addr)
	}
	ts, err := parseTopics(topics)
	if err != nil {
		return nil, err
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.GroupMinSessionTimeout(minSession),
		kfake.AllowAutoTopicCreation(),
	}
	for _, t := range ts {
		opts = append(opts, kfake.SeedTopics(t.partitions, t.name))
	}
	lvl, err := parseLogLevel(logLevel)
	if err != nil {
		return nil, err
	}
	if lvl != kfake.LogLevelNone {
		opts = append(opts, kfake.WithLogger(kfake.BasicLogger(os.Stderr, lvl)))
	}
	return opts, nil
}

type topic struct {
	name       string
	partitions int32
}

// parseTopics parses "a:3,b:1,c" (partitions default to 1).
func parseTopics(s string) ([]topic, error) {
	var ts []topic
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, ps, ok := strings.Cut(f, ":")
		t := topic{name: name, partitions: 1}
		if ok {
			n, err := strconv.Atoi(ps)
			if err != nil || n < 1 || n > 10000 {
				return nil, fmt.Errorf("-topics: %q: partitions must be a positive number", f)
			}
			t.partitions = int32(n)
		}
		if t.name == "" {
			return nil, fmt.Errorf("-topics: %q: empty topic name", f)
		}
		ts = append(ts, t)
	}
	return ts, nil
}

func parseLogLevel(s string) (kfake.LogLevel, error) {
	switch strings.ToLower(s) {
	case "", "none":
		return kfake.LogLevelNone, nil
	case "error":
		return kfake.LogLevelError, nil
	case "warn":
		return kfake.LogLevelWarn, nil
	case "info":
		return kfake.LogLevelInfo, nil
	case "debug":
		return kfake.LogLevelDebug, nil
	}
	return 0, fmt.Errorf("-log-level %q: want none, error, warn, info or debug", s)
}
