package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Two kcr standby --replicas on the 3-broker cluster, their claims, lag
// watch and hold over SASL_SSL (SCRAM-SHA-512), sharing a
// --replicas-key-file. kcr creates the claims topic with broker
// timestamps. While they sleep, a client of the PLAINTEXT listener (anyone
// who can write the topic) writes claims of its own, dated an hour ahead
// and asking for many members, and junk, all keyed by their group: a
// burst still wakes exactly one replica, and every record is processed.
func TestClusterStandbyReplicas(t *testing.T) {
	c := needCluster(t)
	claims := uniqueName("cluster-claims")
	r := &replicaRig{t: t, k: c.kafkaEnv, topic: c.newTopic("cluster-replicas", 3), group: uniqueName("cluster-replicas")}
	key := filepath.Join(t.TempDir(), "replicas-key")
	if err := os.WriteFile(key, []byte("e2e shared replicas key, 32 bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.flags = append(c.standbyKafkaArgs("scram-sha-512"), "--idle", "2s", "--group", r.group, "--topics", r.topic, "--replicas",
		"--replicas-topic", claims, "--replicas-key-file", key, "--scale-up-after", replicaScaleUp.String(),
		"-e", "KGOAPP_CONSUME_OPTS=block-rebalance")
	r.svc = append(append(consumerArgs(kgoBin, c.brokers, r.topic, r.group), c.clientArgs("scram-sha-512")...), "-proc-delay", "20ms")
	for i := range 2 {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("replica%d", i))
		r.dirs = append(r.dirs, dir)
		r.runs = append(r.runs, c.startStandbyNoKafka(dir, r.flags, r.svc...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			r.timeline()
		}
	})
	r.allAsleep("idle")

	cfg, err := c.adm.DescribeTopicConfigs(t.Context(), claims)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := cfg.On(claims, nil); err != nil || !hasConfig(v.Configs, "message.timestamp.type", "LogAppendTime") {
		t.Errorf("the claims topic kcr created: %+v, %v; want message.timestamp.type LogAppendTime", v, err)
	}

	// A forger on the PLAINTEXT listener: claims on every offset it
	// writes, an hour ahead, wanting 50 members, and junk.
	ends, err := c.adm.ListEndOffsets(t.Context(), claims)
	if err != nil {
		t.Fatal(err)
	}
	prev := ends[claims][0].Offset - 1
	for i := range 20 {
		var v []byte
		if i%4 == 3 {
			v = []byte("junk")
		} else {
			v, _ = json.Marshal(map[string]any{"v": 1, "kind": "claim", "replica": fmt.Sprintf("forger-%d", i), "prev": prev, "live": 0, "want": 50})
		}
		rec, err := c.cl.ProduceSync(t.Context(), &kgo.Record{Topic: claims, Key: []byte(r.group), Value: v, Timestamp: time.Now().Add(time.Hour)}).First()
		if err != nil {
			t.Fatal(err)
		}
		prev = rec.Offset
	}

	c.produceN(r.topic, 20)
	r.waitProcessed(90 * time.Second)
	if w := r.kafkaWakes(); sum(w) != 1 {
		t.Errorf("a burst to the sleeping group, after forged claims, woke %v replicas (by replica), want exactly one", w)
	}
	for i, s := range r.runs {
		if n := s.countLogs("standby: replicas: records of the group in the claims topic that do not count (junk, forged or of another kcr); they change nothing"); n == 0 {
			t.Errorf("replica %d did not log the forged records", i)
		}
	}
	r.allAsleep("after the burst")
}

func hasConfig(cs []kadm.Config, name, value string) bool {
	for _, c := range cs {
		if c.Key == name && c.Value != nil && *c.Value == value {
			return true
		}
	}
	return false
}
