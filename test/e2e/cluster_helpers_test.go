package e2e

// Helpers of the tests on the 3-broker cluster of scripts/kafka-up.sh's
// cluster mode (KCR_KAFKA_BROKERS_N=3): PLAINTEXT for the test's own
// clients, SASL_SSL (SCRAM-SHA-512, OAUTHBEARER) for the services.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// clusterEnv is the cluster: a kafkaEnv on its PLAINTEXT listeners, and
// what cluster.env says.
type clusterEnv struct {
	*kafkaEnv
	env     map[string]string
	restart bool // a cleanup starts the stopped nodes again
}

// needCluster returns the cluster of $KCR_KAFKA_CLUSTER_HOME once it
// answers, or fails or skips the test (see skipOrFail).
func needCluster(t *testing.T) *clusterEnv {
	t.Helper()
	need(t)
	home := os.Getenv("KCR_KAFKA_CLUSTER_HOME")
	if home == "" {
		skipOrFail(t, "KCR_KAFKA_CLUSTER_HOME is not set (KCR_KAFKA_BROKERS_N=3 scripts/kafka-up.sh starts the cluster; scripts/test.sh sets it)")
	}
	f, err := os.Open(filepath.Join(home, "cluster.env"))
	if err != nil {
		skipOrFail(t, "no cluster: %v (KCR_KAFKA_BROKERS_N=3 scripts/kafka-up.sh writes it)", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	c := &clusterEnv{kafkaEnv: kafkaAt(t, env["KCR_KAFKA_CLUSTER_BROKERS"]), env: env}
	c.waitInSync()
	return c
}

// clientArgs are a test program's flags to reach the cluster over SASL_SSL
// with mech ("scram-sha-512" or "oauthbearer").
func (c *clusterEnv) clientArgs(mech string) []string {
	brokers := c.env["KCR_KAFKA_CLUSTER_SCRAM_BROKERS"]
	if mech == "oauthbearer" {
		brokers = c.env["KCR_KAFKA_CLUSTER_OAUTH_BROKERS"]
	}
	return []string{"-brokers", brokers, "-sasl", mech, "-tls-ca", c.env["KCR_KAFKA_CLUSTER_CA"],
		"-sasl-user", c.env["KCR_KAFKA_CLUSTER_SCRAM_USER"], "-sasl-password", c.env["KCR_KAFKA_CLUSTER_SCRAM_PASSWORD"]}
}

// standbyKafkaArgs are kcr standby's flags to reach the cluster over
// SASL_SSL with mech, its own Kafka clients as the service's: SCRAM's
// password, or an OAUTHBEARER token good for an hour, in a file.
func (c *clusterEnv) standbyKafkaArgs(mech string) []string {
	t := c.t
	t.Helper()
	file := filepath.Join(t.TempDir(), "kafka-secret")
	secret := c.env["KCR_KAFKA_CLUSTER_SCRAM_PASSWORD"] + "\n"
	args := []string{"--brokers", c.env["KCR_KAFKA_CLUSTER_SCRAM_BROKERS"], "--kafka-tls-ca", c.env["KCR_KAFKA_CLUSTER_CA"], "--kafka-sasl-mechanism", mech}
	if mech == "oauthbearer" {
		secret = unsecuredJWT("kcr-standby", time.Hour)
		args[1] = c.env["KCR_KAFKA_CLUSTER_OAUTH_BROKERS"]
		args = append(args, "--kafka-sasl-token-file", file)
	} else {
		args = append(args, "--kafka-sasl-user", c.env["KCR_KAFKA_CLUSTER_SCRAM_USER"], "--kafka-sasl-password-file", file)
	}
	if err := os.WriteFile(file, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	return args
}

// unsecuredJWT is a token for the cluster's unsecured OAUTHBEARER
// validator (alg none), valid for life from now.
func unsecuredJWT(sub string, life time.Duration) string {
	now := time.Now().Unix()
	claims, _ := json.Marshal(map[string]any{"sub": sub, "iat": now, "exp": now + int64(life/time.Second)})
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"none"}`)) + "." + enc.EncodeToString(claims) + "."
}

// scriptEnv makes scripts/kafka-up.sh and kafka-down.sh act on node (0: all).
func (c *clusterEnv) scriptEnv(node int) []string {
	var env []string
	for k, v := range c.env {
		if !strings.HasPrefix(k, "KCR_KAFKA_CLUSTER_") {
			env = append(env, k+"="+v)
		}
	}
	if node > 0 {
		env = append(env, "KCR_KAFKA_NODE="+strconv.Itoa(node))
	}
	// A node's start, its JVM's above all, can take a minute on a loaded
	// machine: a generous wait, within runScript's 3 minutes.
	return append(env, "KCR_KAFKA_KEEP_DATA=1", "KCR_KAFKA_TIMEOUT=150")
}

// nodeDown stops broker node (a clean shutdown) and registers a cleanup
// that starts every stopped node again.
func (c *clusterEnv) nodeDown(node int) {
	c.t.Helper()
	if !c.restart {
		c.restart = true
		c.t.Cleanup(func() {
			if _, err := runScript("kafka-up.sh", c.scriptEnv(0)...); err != nil {
				c.t.Errorf("restarting the cluster at cleanup: %v", err)
			}
		})
	}
	script(c.t, "kafka-down.sh", c.scriptEnv(node)...)
}

// nodeUp starts broker node again with its data, and waits until every
// partition is fully replicated again.
func (c *clusterEnv) nodeUp(node int) {
	c.t.Helper()
	script(c.t, "kafka-up.sh", c.scriptEnv(node)...)
	c.waitInSync()
}

// waitInSync waits until the three brokers are registered and every
// partition (those of __consumer_offsets included) has all its replicas in
// sync, so that the next broker may stop without making any unavailable.
func (c *clusterEnv) waitInSync() {
	c.t.Helper()
	eventually(c.t, 120*time.Second, "3 brokers and every partition with all its replicas in sync", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m, err := c.adm.Metadata(ctx)
		if err != nil {
			return false, err.Error()
		}
		if len(m.Brokers) != 3 {
			return false, fmt.Sprintf("%d brokers", len(m.Brokers))
		}
		var short []string
		for _, td := range m.Topics {
			for _, p := range td.Partitions {
				if p.Err != nil || len(p.ISR) < len(p.Replicas) || p.Leader < 0 {
					short = append(short, fmt.Sprintf("%s/%d isr %v", td.Topic, p.Partition, p.ISR))
				}
			}
		}
		return len(short) == 0, fmt.Sprintf("%d short: %v", len(short), short[:min(len(short), 5)])
	})
}

// coordinator returns the broker that coordinates group.
func (c *clusterEnv) coordinator(group string) int32 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r := c.adm.FindGroupCoordinators(ctx, group)
	for _, co := range r {
		if co.Err != nil {
			c.t.Fatalf("find coordinator of %s: %v", group, co.Err)
		}
		return co.NodeID
	}
	c.t.Fatalf("no coordinator for %s", group)
	return -1
}

// moveLeaders makes another replica the leader of every partition of topic
// (a reassignment that rotates the replica list, then a preferred leader
// election) and returns the new leaders.
func (c *clusterEnv) moveLeaders(topic string) map[int32]int32 {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := c.adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	old := map[int32]int32{}
	var req kadm.AlterPartitionAssignmentsReq
	for _, p := range m.Topics[topic].Partitions {
		old[p.Partition] = p.Leader
		rs := slices.Clone(p.Replicas)
		for rs[0] == p.Leader {
			rs = append(rs[1:], rs[0])
		}
		req.Assign(topic, p.Partition, rs)
	}
	res, err := c.adm.AlterPartitionAssignments(ctx, req)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("reassign %s: %v", topic, err)
	}
	moved := map[int32]int32{}
	eventually(t, 60*time.Second, "every leader of "+topic+" moved", func() (bool, string) {
		set := kadm.TopicsSet{}
		for p := range old {
			set.Add(topic, p)
		}
		if _, err := c.adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, set); err != nil {
			return false, err.Error()
		}
		m, err := c.adm.Metadata(ctx, topic)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range m.Topics[topic].Partitions {
			moved[p.Partition] = p.Leader
		}
		for p, l := range old {
			if moved[p] == l || moved[p] < 0 {
				return false, fmt.Sprintf("leaders %v, were %v", moved, old)
			}
		}
		return true, ""
	})
	return moved
}
