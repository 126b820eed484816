package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// setShareEarliest sets share group group's share.auto.offset.reset to
// earliest (-share-earliest): records produced before the group first
// fetched, or while every member sleeps, are delivered.
func setShareEarliest(brokers []string, group string) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, secOpts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	v := "earliest"
	c.Name, c.Value = "share.auto.offset.reset", &v
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("share.auto.offset.reset of share group %s: %w", group, err)
	}
	return nil
}

// produceBurst produces n records numbered from 1 to topic at once
// (-burst), and returns once all are acknowledged; its event "burst" has
// the time they were sent (sent_ns).
func produceBurst(brokers []string, topic, clientID string, n int) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID(clientID), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5 * time.Millisecond)}, secOpts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Value: []byte(strconv.Itoa(i + 1))}
	}
	sent := time.Now()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return err
	}
	emit("burst", "records", n, "sent_ns", sent.UnixNano())
	return nil
}
