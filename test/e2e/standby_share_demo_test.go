package e2e

import "testing"

// scripts/demo-share.sh passes (it exits non-zero on any failure: a job
// not done, a single replica doing all the jobs of the one partition, a
// job done twice without a release, a replica still awake at the end): on
// kfake, and on the broker with production group settings.
func TestStandbyShareDemoScript(t *testing.T) {
	for _, broker := range []string{"kfake", "kafka"} {
		t.Run(broker, func(t *testing.T) {
			env := []string{"KCR_DEMO_BROKER=" + broker}
			if broker == "kafka" {
				env = append(env, "KCR_KAFKA_PROD_BROKERS="+needKafkaProd(t).brokers)
			} else {
				need(t)
			}
			script(t, "demo-share.sh", env...)
		})
	}
}
