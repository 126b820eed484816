package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kcr standby on the cluster, the service and kcr's own lag watch and
// group hold over SASL_SSL with the same mechanism. The service sleeps
// through three disruptions, each followed by records that wake it:
//  1. the broker that coordinates its group stopped (and still down at the
//     wake);
//  2. every partition leader of its topic moved; the wake is a connection
//     to --listen (socket activation), then records;
//  3. a rolling restart of the three brokers.
//
// One cold start, every wake a restore, every record processed exactly
// once (the test's own producer and end offsets). kafka-go over
// SCRAM-SHA-512 (kcr standby's password in a file); franz-go over
// OAUTHBEARER with 5 s tokens, which expire while it sleeps (kcr standby's
// token in a file, renewed by reauthentication every 30 s).
func TestClusterStandby(t *testing.T) {
	for _, tc := range []struct {
		name, bin, mech string
		extra           []string
	}{
		{"kafka-go-scram", kafkaBin, "scram-sha-512", nil},
		{"franz-go-oauthbearer", kgoBin, "oauthbearer", []string{"-token-lifetime", "5s", "-kgo-log"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testClusterStandby(t, tc.bin, tc.mech, tc.extra) })
	}
}

func testClusterStandby(t *testing.T, bin, mech string, extra []string) {
	c := needCluster(t)
	start := time.Now()
	topic, group := c.newTopic("cluster-sb", 3), uniqueName("cluster-sb")
	flags := append(c.standbyKafkaArgs(mech), "--idle", "1s", "--group", group, "--topics", topic, "--poll", "100ms")
	svc := append(append(consumerArgs(bin, c.brokers, topic, group), c.clientArgs(mech)...), extra...)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	flags = append(flags, "--listen", addr)
	svc = append(svc, "-listen-fds")
	s := c.startStandbyNoKafka(filepath.Join(t.TempDir(), "img"), flags, svc...)
	wakes := 0
	wake := func(what string) {
		t.Helper()
		c.produceN(topic, 6)
		s.waitAllProcessed(topic, 120*time.Second)
		wakes++
		t.Logf("%s: every record processed once (%v into the test)", what, time.Since(start).Round(time.Second))
	}

	// 1. The coordinator's broker stopped.
	s.waitState("standby", 90*time.Second)
	node := c.coordinator(group)
	c.nodeDown(int(node))
	wake("coordinator (broker " + itoa(int(node)) + ") stopped")
	c.nodeUp(int(node))

	// 2. The partition leaders moved.
	s.waitState("standby", 90*time.Second)
	moved := c.moveLeaders(topic)
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	conn.Close()
	var st appState
	if err != nil || json.Unmarshal(line, &st) != nil || st.Gen == 0 {
		t.Fatalf("the service's answer through --listen: %q, %v: want the state of a restored instance", line, err)
	}
	wake("leaders moved to " + itoa(len(moved)) + " other brokers")

	// 3. A rolling restart: kcr standby's lag watch and group hold live
	// through it.
	s.waitState("standby", 90*time.Second)
	for n := 1; n <= 3; n++ {
		c.nodeDown(n)
		c.nodeUp(n)
	}
	wake("rolling restart")
	s.waitState("standby", 90*time.Second)

	if n := s.countLogs("standby: starting"); n != 1 {
		t.Errorf("%d cold starts, want 1", n)
	}
	kafka, byConn := s.countLogs("standby: running", "source", "kafka"), s.countLogs("standby: running", "source", "connection")
	// At least one restore per wake: a service restored by a connection may
	// go idle again before the records arrive, and lag wakes it once more.
	if kafka+byConn < wakes || byConn != 1 {
		t.Errorf("restores woken by lag %d, by a connection %d; want %d or more in all, 1 by a connection", kafka, byConn, wakes)
	}
	if n := s.countLogs("standby: restore failed; starting the service cold"); n != 0 {
		t.Errorf("%d failed restores", n)
	}
	for _, e := range s.svcEvents() {
		if e["ev"] == "after" && e["kind"] != "restore" {
			t.Errorf("after-restore event of kind %v: %v", e["kind"], e)
		}
		if e["ev"] == "log" && strings.Contains(strings.ToLower(fmt.Sprint(e)), "sasl") {
			t.Errorf("the service logged a SASL failure: %v", e)
		}
	}
	t.Logf("test took %v", time.Since(start).Round(time.Second))
}

func itoa(n int) string { return fmt.Sprint(n) }
