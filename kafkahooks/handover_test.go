package kafkahooks

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kcr-dev/kcr/internal/testkit/hooktest"
	"github.com/kcr-dev/kcr/notify"
)

// TestReaderGroupHandover (kfake): with WithGroupHandover the checkpoint
// keeps the member in the group (kafka-go's log call names it: this fails
// if a kafka-go upgrade changes that call), a restore joins a fresh member,
// removes the old one, and the records go on from the committed offsets,
// none committed before the checkpoint delivered again. Clones are covered
// by the fresh member id: two restores of one image never share one.
func TestReaderGroupHandover(t *testing.T) {
	const topic, group, parts, n, before = "h", "hgrp", 3, 40, 20
	k, adm, reg, log, _ := groupRig(t, parts, topic, n)
	var down map[string][]int32
	hook(reg, func(context.Context) error {
		_, down, _ = tryGroupMembers(adm, group, topic)
		return nil
	}, nil)
	r := NewReader(kafka.ReaderConfig{Brokers: k.addrs, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		MaxWait: 100 * time.Millisecond, SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second,
		RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 100 * time.Millisecond},
		WithRegistry(reg), WithLogger(log), WithGroupHandover())
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	seen := map[string]int{}
	fetch := func() {
		t.Helper()
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if seen[string(m.Value)] > 0 {
			t.Errorf("record %s delivered again", m.Value)
		}
		seen[string(m.Value)]++
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for range before {
		fetch()
	}
	res := hooktest.SimulateOK(t, context.Background(), reg, notify.SimRestore, 10*time.Second)
	rep := decodeReport[ReaderReport](t, res.Before[0].Details)
	if rep.GroupCheckpoint == nil || rep.MemberKept == "" || rep.LeftGroup || rep.SessionTimeoutMS != 6000 {
		t.Fatalf("report %+v: want a kept member, session_timeout_ms 6000", rep.GroupCheckpoint)
	}
	if _, ok := down[rep.MemberKept]; !ok || len(down) != 1 {
		t.Errorf("while down the group has %v, want the kept member %s", down, rep.MemberKept)
	}
	for len(seen) < n {
		fetch()
	}
	for i := range n {
		if seen[strconv.Itoa(i)] != 1 {
			t.Errorf("record %d delivered %d times", i, seen[strconv.Itoa(i)])
		}
	}
	waitFor(t, 10*time.Second, "the hand-over to finish", func() bool { _, ok := r.Handover(); return ok })
	if h, _ := r.Handover(); h.Result != HandoverDone || !slices.Equal(h.Old, []string{rep.MemberKept}) {
		t.Errorf("hand-over %+v, want %s removed", h, rep.MemberKept)
	}
	_, members := groupMembers(t, adm, group, topic)
	if len(members) != 1 {
		t.Fatalf("after the restore the group has %v, want one member", members)
	}
	for id, ps := range members {
		if id == rep.MemberKept || !slices.Equal(ps, []int32{0, 1, 2}) {
			t.Errorf("member %s owns %v; want a new member owning [0 1 2]", id, ps)
		}
	}
}
