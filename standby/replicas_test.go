package standby

import (
	"testing"
	"time"
)

// --replicas-key-file is for replicas only.
func TestReplicasKeyFileNeedsReplicas(t *testing.T) {
	o := Options{Args: []string{"true"}, ImageDir: t.TempDir(), Idle: time.Second, ReplicasKeyFile: "key"}
	if err := o.check(); err == nil {
		t.Error("--replicas-key-file without --replicas accepted")
	}
}
