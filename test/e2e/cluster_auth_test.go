package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// setSCRAM creates or changes user's SCRAM-SHA-512 password.
func (c *clusterEnv) setSCRAM(user, password string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: user, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: password}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		c.t.Fatalf("set the SCRAM password of %s: %v", user, err)
	}
}

// A SCRAM password changed while the service sleeps under kcr standby: the
// lag wakes it, the restore succeeds, and the after-restore hooks (kafkahooks
// for kafka-go, kgohooks for franz-go) find the credentials refused: kcr
// standby logs that one error, naming SASL, instead of a service that
// retries in silence.
func TestClusterSCRAMPasswordChanged(t *testing.T) {
	for _, tc := range []struct{ name, bin, errText string }{
		{"kafka-go", kafkaBin, "kafkahooks: SASL authentication failed after the restore"},
		{"franz-go", kgoBin, "kgohooks: SASL authentication failed after the restore"},
	} {
		t.Run(tc.name, func(t *testing.T) { testSCRAMPasswordChanged(t, tc.bin, tc.errText) })
	}
}

func testSCRAMPasswordChanged(t *testing.T, bin, errText string) {
	c := needCluster(t)
	user := uniqueName("user")
	c.setSCRAM(user, "before")
	topic, group := c.newTopic("cluster-pw", 2), uniqueName("cluster-pw")
	svc := append(consumerArgs(bin, c.brokers, topic, group), c.clientArgs("scram-sha-512")...)
	svc = append(svc, "-sasl-user", user, "-sasl-password", "before")
	dir := filepath.Join(t.TempDir(), "img")
	s := c.startStandby(dir, []string{"--idle", "1s", "--group", group, "--topics", topic, "--poll", "100ms"}, svc...)
	s.waitState("standby", 90*time.Second)
	c.setSCRAM(user, "after")
	c.produceN(topic, 4)
	const msg = "restored, but the after-restore hooks failed; the service runs"
	eventually(t, 60*time.Second, "kcr standby reporting the failed hooks", func() (bool, string) {
		return s.countLogs(msg) > 0, fmt.Sprintf("%d", s.countLogs(msg))
	})
	var errs []string
	for _, l := range s.logs() {
		if l["msg"] == msg {
			errs = append(errs, fmt.Sprint(l["err"]))
		}
	}
	t.Logf("kcr standby: %s: %v", msg, errs)
	if len(errs) != 1 || !strings.Contains(errs[0], errText) {
		t.Fatalf("reported errors %q: want one naming the SASL failure after the restore", errs)
	}
}
