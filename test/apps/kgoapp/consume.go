package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/kafkahooks/kgohooks"
	"github.com/kcr-dev/kcr/notify"
	"github.com/kcr-dev/kcr/test/apps/appkit"
)

// procDelay is the time -consume spends on each record (-proc-delay).
var procDelay time.Duration

// runConsume is the group consumer mode (-consume): poll, log what was
// processed ("proc", as kafkaapp), then commit it (at-least-once). With
// balancer "server" the group is a KIP-848 one (kgo.ServerSideBalancer);
// with an instance id the member is static (kgo.InstanceID).
//
// KGOAPP_CONSUME_OPTS (comma-separated, from the environment, so that the
// shared group test runs unchanged) varies the kgo options:
// "block-rebalance" (kgo.BlockRebalanceOnPoll; the loop calls
// AllowRebalance after each commit), "reset-end" (ConsumeResetOffset
// AtEnd instead of AtStart). With listenFDs it serves its state on the
// socket of kcr standby --listen.
func runConsume(brokers []string, topic, group, clientID, balancer, instanceID string, listenFDs bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	extra := strings.Split(os.Getenv("KGOAPP_CONSUME_OPTS"), ",")
	block := slices.Contains(extra, "block-rebalance")
	reset := kgo.NewOffset().AtStart()
	if slices.Contains(extra, "reset-end") {
		reset = kgo.NewOffset().AtEnd()
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID), kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(reset),
		kgo.FetchMaxWait(500 * time.Millisecond), kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second), isolation()}
	if block {
		opts = append(opts, kgo.BlockRebalanceOnPoll())
	}
	switch balancer {
	case "":
	case "server":
		opts = append(opts, kgo.ServerSideBalancer())
	case "custom":
		opts = append(opts, kgo.Balancers(customRange{kgo.RangeBalancer()}))
	default:
		return errors.New("-balancer must be empty (classic), server (KIP-848) or custom (classic, a custom assignor)")
	}
	if instanceID != "" {
		opts = append(opts, kgo.InstanceID(instanceID))
	}
	cl, err := kgohooks.NewClient(append(opts, secOpts...)...)
	if err != nil {
		return err
	}
	notify.Register("kgoapp", notify.Func(nil, func(_ context.Context, ev notify.Event) error {
		appkit.EmitAfter(ev, "reader_client", cl.ClientID(), "instance_id", cl.InstanceID())
		return nil
	}))
	var procd atomic.Int64
	addr := ""
	if listenFDs {
		ln, err := appkit.HandedListener()
		if err != nil {
			return err
		}
		addr = ln.Addr().String()
		go appkit.ServeState(ln, func() map[string]any {
			return map[string]any{"reader_client": cl.ClientID(), "processed": procd.Load()}
		})
	}
	srv, err := notify.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	emit("ready", "listen", addr, "socket", srv.Path())
	// With -proc-delay, at most 200 ms of records per poll: the service
	// stays active (every poll is activity) and its commits frequent.
	maxRecs := -1
	if procDelay > 0 {
		maxRecs = max(1, int(200*time.Millisecond/procDelay))
	}
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, maxRecs)
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.Canceled) {
				emit("fetch-error", "err", err.Error())
			}
		})
		byPart := map[int32][]int{}
		var recs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			byPart[r.Partition] = append(byPart[r.Partition], int(r.Offset))
			recs = append(recs, r)
		})
		if len(recs) == 0 {
			cl.AllowRebalance()
			continue
		}
		time.Sleep(time.Duration(len(recs)) * procDelay)
		// Logged before the commit: whatever was committed was logged.
		procd.Add(int64(len(recs)))
		for p, offs := range byPart {
			for _, r := range appkit.Runs(offs) {
				emit("proc", "p", p, "from", r[0], "to", r[1])
			}
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := cl.CommitRecords(cctx, recs...); err != nil {
			emit("commit-error", "err", err.Error(), "records", len(recs))
		}
		cancel()
		cl.AllowRebalance() // kgo's documented loop with BlockRebalanceOnPoll (a no-op without)
	}
	cl.CloseAllowingRebalance()
	emit("exit", "processed", procd.Load())
	return nil
}

// customRange is a custom assignor, as an application may have: range
// under a protocol name of its own.
type customRange struct{ kgo.GroupBalancer }

func (customRange) ProtocolName() string { return "kgoapp-custom-range" }
